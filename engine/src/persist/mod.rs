//! A keyspace outside memory, and back: two forms of the same state.
//!
//! - [`dump`]: the portable, canonical form. [`crate::Keyspace::dump`] enumerates the state as
//!   plain data, one node per block position (independent of how the trie is cut into runs),
//!   with the operation records and stamps that decide future eviction and expiry;
//!   [`crate::KeyspaceDump::retain_partitions`] keeps some partitions' holders.
//! - [`rebuild`]: [`crate::Keyspace::rebuild`], a keyspace from a dump, with maximal runs.
//! - [`image`]: the fast form. [`crate::Keyspace::write_image`] writes the in-memory layout as
//!   checksummed sections and [`crate::Keyspace::read_image`] restores it with bulk copies.
//!   The section format (`crate::image_format`) sits below the structures, which write their
//!   own sections, and below this module, which puts them in order.
//! - `transplant`: [`crate::Keyspace::replace_group`], one partition's holders dumped from a
//!   rebuilt keyspace and grafted onto this one (anti-entropy repair).
//!
//! Either form round-trips exactly: the restored keyspace answers, digests and evolves like the
//! original.

pub mod dump;
pub mod image;
pub mod rebuild;
mod transplant;

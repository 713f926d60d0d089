//! Checkpoints that releases before the serde codec wrote (formats 2 to 5): their hand-laid
//! metas and partition values are read here, so a replica upgraded from one of them restores
//! its own and its peers' checkpoints instead of replaying the whole log
//! (`tests/old_format.rs` restores a stored format-5 checkpoint). New checkpoints are always
//! written in this build's format ([`crate::FORMAT_VERSION`]); an older checkpoint's meta is
//! only re-encoded in its own format when it is passed on as stored (an export, an import).
//!
//! Module map:
//! - [`layout`]: the bounds-checked little-endian reader and writer of those formats.
//! - [`meta`]: metas of formats 2 to 5.
//! - [`partitions`]: partition values of formats 2 to 5 (digest points from format 5).
//! - [`dump`]: format-2 keyspace values (columnar dumps, rebuilt node by node).

pub mod dump;
pub mod layout;
pub(crate) mod meta;
pub mod partitions;

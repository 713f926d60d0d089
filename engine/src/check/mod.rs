//! Checking a keyspace against itself: everything writes maintain by hand, recomputed.
//!
//! - [`invariants`]: [`crate::Keyspace::check_invariants`], one full pass (pins, counts,
//!   digests, run layout, tables, free lists, overrides, derived holder indices) that names the
//!   first disagreement. The trie's structural half is the trie's own (`crate::trie`'s check).
//! - [`scrub`]: the same checks cut into steps of bounded cost
//!   ([`crate::Keyspace::scrub_step`]), so a running replica verifies the structures queries
//!   read against its digests; a finding names the partitions to repair.
//!
//! The checks of one holder that both share (its card, its records, its overrides) are written
//! once, in `invariants`.

pub mod invariants;
pub mod scrub;

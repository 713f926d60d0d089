//! prefixlog's engine: exact, deterministic prefix tries per keyspace. No I/O.
//!
//! The engine is the last stop of a record's journey (Kafka → `ingest` → here) and the first
//! of a query's (`query` → here). It knows nothing about Kafka, RocksDB or gRPC: every write
//! carries the log time it happened at, and the state is a pure function of the writes.
//!
//! Module map:
//! - [`types`]: holder and keyspace ids, options, results, errors.
//! - [`partition`]: [`partition_of`], which log partition a worker's records live in (a
//!   cross-language contract with golden vectors).
//! - [`engine`]: [`Engine`], all keyspaces of a replica, each in a [`KeyspaceCell`].
//! - [`cell`]: [`KeyspaceCell`], a keyspace behind one lock, or two identical copies so that
//!   queries never wait on a write (`serve --query-copy`).
//! - [`keyspace`]: [`Keyspace`], the write operations (store, remove, clear, place),
//!   capacity policy; `aggregates`: its digests and counts, summed over holders and carried
//!   once per operation.
//! - `leaving`: how holders leave: [`Keyspace::drop_worker`], [`Keyspace::expire`] (TTL), and
//!   inferred holders forgotten once empty, each visiting only the holders it changes.
//! - `members`: holder membership of runs (added and removed stretch by stretch), and the
//!   operation records that own it.
//! - `matching`: [`Keyspace::match_chain`], longest contiguous prefix per holder, run by run.
//! - `tier_match`: the same where holders off the GPU exist: a slot's tiers combined, each
//!   position credited to the first tier in the query's preference order that holds it.
//! - [`dump`]: enumerate ([`Keyspace::dump`], [`Keyspace::dump_partitions`]) and filter
//!   ([`KeyspaceDump::retain_partitions`]) as plain data, one node per block position.
//! - `rebuild`: [`Keyspace::rebuild`] from a dump, with maximal runs; [`RebuildError`].
//! - [`image`]: [`Keyspace::write_image`] / [`Keyspace::read_image`], the in-memory layout as
//!   checksummed sections, restored with bulk copies (fast restart); `image_format`: the
//!   section format (tags, writer, reader, [`ImageError`]) that each structure writes itself
//!   in, below both the structures and the image.
//! - [`invariants`]: [`Keyspace::check_invariants`], recomputing everything writes maintain
//!   by hand (pins, counts, digests, run layout, tables, free lists, overrides);
//!   `trie_check`: its structural half.
//! - [`scrub`]: the same checks cut into steps of bounded cost ([`Keyspace::scrub_step`]), so
//!   a running replica verifies the structures queries read against its digests.
//! - `transplant`: [`Keyspace::replace_group`], moving one partition's holders in from a
//!   rebuilt keyspace (anti-entropy repair).
//! - `trie`: the path-compressed trie: runs of blocks with one membership list each, child and
//!   ext lookup, splitting, walking and creating chains; `trie::reclaim`: freeing dead runs,
//!   merging runs a removal left with equal members, shrinking a run's tail.
//! - `same`: the flag a run carries when its only child has the same holders, so a match
//!   steps into that child without comparing holder lists.
//! - `runs`: the run records and their arena; `blocks`: per-block storage (locals, canonical
//!   exts, run ids) and the allocator of the block ranges runs occupy.
//! - `table`: the lookup tables: Robin Hood open addressing, hash bits stored beside indices,
//!   parts of staggered sizes; `table::image`: a table's sections in a checkpoint image.
//! - `ahead`: growing tables and block storage ahead of the write lock, so a write holds it
//!   only to swap the grown arrays in.
//! - `holder`: per-holder counts, digest and operation records; the derived holder indices
//!   (key order, holders per partition, the expiry queue), rebuilt on read.
//! - [`digest`]: the hash mixing behind node identity and digests.
//! - `store_check`: refusing stores that cannot be a chain (an ext named twice, or the parent
//!   named among the blocks).
//! - [`scheme`]: canonical block hashes of token ids (scheme 1: xxh3-64 chained; LoRA namespace,
//!   cache salt and per-block multimodal keys), golden vectors.
//!
//! Guarantees (each has tests in `tests/`):
//! - Never overcount: a holder's depth stops at the first position it does not hold.
//! - Determinism: the same operations in the same order give the same answers and digests;
//!   `dump` → `rebuild` preserves answers, digests and future behaviour.
//! - Inferred (placement) state never overrides an event-fed holder.
//! - Bounded work: dropping a worker visits its holders only, expiry only the holders of its
//!   partition with something due; a keyspace exists exactly while it has holders, and an
//!   empty one costs a few KiB.
//! - Capacity: a holder over its bound loses the blocks of its least recently stored
//!   operations first (whole store/placement operations, oldest first, skipping blocks that a
//!   later operation stored again) until it is at 7/8 of the bound.

mod aggregates;
mod ahead;
mod blocks;
pub mod cell;
pub mod digest;
pub mod dump;
pub mod engine;
mod holder;
pub mod image;
mod image_format;
pub mod invariants;
pub mod keyspace;
mod leaving;
mod matching;
mod members;
pub mod partition;
mod rebuild;
mod runs;
mod same;
pub mod scheme;
pub mod scrub;
mod store_check;
mod table;
mod tier_match;
mod transplant;
mod trie;
mod trie_check;
pub mod types;

pub use cell::KeyspaceCell;
pub use dump::{DumpHolder, DumpNode, KeyspaceDump};
pub use engine::{Engine, SharedKeyspace};
/// Test-only knobs (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    pub use crate::trie::set_max_run_for_test;
}
pub use image::ImageError;
pub use invariants::InvariantError;
pub use keyspace::{HolderSummary, Keyspace, PlaceOutcome};
pub use rebuild::RebuildError;
pub use scrub::{ScrubCursor, ScrubFinding, ScrubStep};
pub use types::{
    partition_of, ApplyError, EngineConfig, HolderKey, HolderMatch, InvalidStoreReason, KeyspaceId,
    KeyspaceStats, LogTime, MatchDetail, MatchOptions, Tier, TierDepth, TierRun,
};

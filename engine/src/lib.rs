//! prefixlog's engine: exact, deterministic prefix tries per keyspace. No I/O.
//!
//! The engine is the last stop of a record's journey (Kafka → `ingest` → here) and the first
//! of a query's (`query` → here). It knows nothing about Kafka, RocksDB or gRPC: every write
//! carries the log time it happened at, and the state is a pure function of the writes.
//!
//! Module map: folders by the type whose behaviour they hold, from the bottom up.
//! - [`types`]: holder and keyspace ids, options, results and errors (also
//!   [`InvariantError`], shared by the trie's checks and the keyspace's).
//! - [`partition`]: [`partition_of`], which log partition a worker's records live in (a
//!   cross-language contract with golden vectors).
//! - [`digest`]: the hash mixing behind node identity and digests.
//! - [`scheme`]: canonical block hashes of token ids (scheme 1: xxh3-64 chained; LoRA namespace,
//!   cache salt and per-block multimodal keys), golden vectors.
//! - `image_format`: the section format of images (tags, writer, reader, [`ImageError`]), below
//!   the structures that write their own sections and the image that puts them in order.
//! - `trie/`: the path-compressed trie (`Trie`): runs of blocks with one membership list each;
//!   child and ext lookup, paths, windows (`mod.rs`); walking a chain and creating what it
//!   lacks, splitting runs (`insert`); freeing, merging and shrinking runs (`reclaim`); the flag
//!   of a run whose only child has the same holders (`same_holders`); growing tables and block
//!   storage ahead of the write lock (`grow_ahead`); its structural invariants (`check`); and
//!   the storage under it: run records (`runs`), per-block storage and its allocator
//!   (`blocks`), the Robin Hood lookup tables (`table/`).
//! - [`keyspace`]: [`Keyspace`], a trie and its holders. The write operations and capacity
//!   (`writes`), store checks (`store_check`), membership of runs and the operation records
//!   that own it (`members`), the holders and their derived indices (`holders`), how holders
//!   leave (`departures`: worker removal, TTL expiry), digests summed over holders
//!   (`aggregates`), and test-only fault hooks (`faults`).
//! - `matching/`: [`Keyspace::match_chain`], longest contiguous prefix per holder: the answer
//!   and its filters (`mod.rs`), the run-by-run walks (`walk`), the tier path (`tiers`),
//!   where a slot's tiers are combined, each position credited to the first tier in the query's
//!   preference order that holds it, and top-k answers (`top`) that stop at the k-th holder
//!   instead of scoring every one (the same order as the all-holders answer cut to k).
//! - [`persist`]: the keyspace as plain data ([`persist::dump`]: [`Keyspace::dump`],
//!   [`KeyspaceDump::retain_partitions`]) and back ([`persist::rebuild`]: [`Keyspace::rebuild`]),
//!   as an image of its layout ([`persist::image`]: [`Keyspace::write_image`] /
//!   [`Keyspace::read_image`]), and one partition's holders moved in from a rebuilt keyspace
//!   (`transplant`: [`Keyspace::replace_group`], anti-entropy repair).
//! - [`check`]: [`Keyspace::check_invariants`], recomputing everything writes maintain by hand,
//!   and [`Keyspace::scrub_step`], the same checks in steps of bounded cost for a running
//!   replica.
//! - [`keyspace_cell`]: [`KeyspaceCell`], a keyspace behind one lock, or two identical copies so
//!   that queries never wait on a write (`serve --query-copy`).
//! - [`engine`]: [`Engine`], all keyspaces of a replica, each in a [`KeyspaceCell`].
//!
//! Imports only point down: a folder's files use each other and the folders below it, never a
//! folder above, and no files import each other in a circle.
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

pub mod check;
pub mod digest;
pub mod engine;
mod image_format;
pub mod keyspace;
pub mod keyspace_cell;
mod matching;
pub mod partition;
pub mod persist;
pub mod scheme;
mod trie;
pub mod types;

pub use check::scrub::{ScrubCursor, ScrubFinding, ScrubStep};
pub use engine::{Engine, SharedKeyspace};
pub use keyspace::{HolderSummary, Keyspace, PlaceOutcome};
pub use keyspace_cell::KeyspaceCell;
pub use persist::dump::{DumpHolder, DumpNode, KeyspaceDump};
pub use persist::image::ImageError;
pub use persist::rebuild::RebuildError;
/// Test-only knobs (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    pub use crate::trie::set_max_run_for_test;

    /// Member lookups so far (process-wide) that searched a long member list by key.
    pub fn keyed_member_lookups() -> u64 {
        crate::keyspace::members::KEYED_LOOKUPS.load(std::sync::atomic::Ordering::Relaxed)
    }
}
pub use types::{
    partition_of, ApplyError, BlockHashes, EngineConfig, HolderKey, HolderMatch, InvalidStoreReason,
    InvariantError, KeyspaceId, KeyspaceStats, LogTime, MatchDetail, MatchOptions, Tier, TierDepth, TierRun,
};

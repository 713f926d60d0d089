//! Replica to replica: anti-entropy and checkpoint transfer, on the `ReplicaPeer` gRPC service
//! (`proto/proto/peer.proto`, its own port).
//!
//! Module map:
//! - [`service`]: the server: digest points, per-holder digests, the newest checkpoint in chunks.
//! - [`antientropy`]: a round asks every peer for its digest points and compares them with ours
//!   at the offsets both have; a mismatch is counted, the differing holders are logged, and
//!   [`repair`] runs.
//! - [`repair`]: the self-check rule and the partition rebuild.
//! - [`bootstrap`]: fetch a peer's newest checkpoint into an empty store.
//!
//! Repair rule: with two replicas nobody can tell who is right, so each replica that sees a
//! mismatch checks *itself*: it rebuilds the partition from its newest checkpoint taken no
//! later than the last point both replicas agreed on, replays its own log to the mismatched
//! point, and compares. If the rebuilt digest differs from what it recorded there, its state
//! diverged from its log: it replays on to its current offset and swaps the rebuilt partition
//! in. Otherwise it is consistent with the log and leaves the repair to the peer, which runs the
//! same check. The rule needs no majority, so it works with two replicas and with more.

pub mod antientropy;
pub mod bootstrap;
pub mod repair;
pub mod service;

pub use antientropy::{AntiEntropy, AntiEntropyStats, RoundReport};
pub use bootstrap::fetch_checkpoint;
pub use repair::{RepairContext, RepairOutcome};
pub use service::PeerService;

//! Replica to replica: anti-entropy, repair and checkpoint transfer, on the `ReplicaPeer` gRPC
//! service (`proto/proto/peer.proto`, its own port).
//!
//! Module map:
//! - [`service`]: the server: digest points (with the state settings and covered partitions),
//!   per-holder digests, checkpoint exports (whole or filtered to some partitions).
//! - [`antientropy`]: a round asks every peer (all at once, each call under a deadline, so a
//!   hung peer delays no other) for its digest points and compares them with ours
//!   at the offsets both have, for the partitions both own, after the one compatibility rule
//!   (a peer with other settings is reported, not compared); a mismatch is counted, the
//!   differing holders ([`holders`]) are logged, and [`repair`] runs.
//! - [`repair`]: the self-check rule and the off-to-the-side partition rebuild and swap.
//! - [`scrub`]: the scrubber: bounded steps that check the structures answering queries
//!   against the digests, and repair a partition they disagree on.
//! - [`client`]: [`PeerClient`], how every call to a peer is made: mutual TLS when
//!   configured, a deadline per call, a size cap per answer; [`CallError`], a call that got no
//!   answer.
//! - [`bootstrap`]: fetch a peer's checkpoint (bootstrap, resharding, recovery of a partition
//!   whose log was cut), with a stall deadline and a size cap.
//! - [`transfer`]: serving checkpoint transfers within bounds (a few at a time, streamed in
//!   bounded chunks, a stalled receiver dropped).
//! - [`tls`]: optional mutual TLS on the peer port.
//!
//! Repair rule: with two replicas nobody can tell who is right, so each replica that sees a
//! mismatch checks *itself*: it rebuilds the partition from its newest checkpoint taken no
//! later than the last point both replicas agreed on, replays its own log to the mismatched
//! point, and compares. If the rebuilt digest differs from what it recorded there, its state
//! diverged from its log: it catches the rebuilt partition up off to the side and has the
//! ingest thread swap it in. Otherwise it is consistent with the log and leaves the repair to
//! the peer, which runs the same check. The rule needs no majority, so it works with two
//! replicas and with more.

pub mod antientropy;
pub mod bootstrap;
pub mod client;
pub mod holders;
pub mod repair;
pub mod scrub;
pub mod service;
pub mod tls;
pub mod transfer;

pub use antientropy::{AntiEntropy, AntiEntropyStats, CompareError, RoundReport};
pub use bootstrap::FetchError;
pub use client::{CallError, PeerClient};
pub use repair::{RepairContext, RepairError, RepairGate, RepairOutcome};
pub use scrub::{ScrubOptions, ScrubReport, ScrubStats, Scrubber};
pub use service::PeerService;
pub use tls::{PeerTls, PeerTlsError};
pub use transfer::ServeLimits;

//! A running replica, assembled in one place: `ReplicaNode::start(LogSpec, NodeOptions)`.
//!
//! `serve`, the demo, the benchmarks and the tests all start replicas through it, so every
//! replica has the same start-up checks, checkpoints, peers, metrics and shutdown.
//!
//! A record's path through a node: Kafka → `ingest::LogReader` (continuity checked) → the
//! ingest thread ([`ingest_thread::IngestThread`]) → `state::Applier` → `engine`. A query's path: the gRPC
//! port (`query::QueryService`) → `engine` under a keyspace read lock, answering for the owned
//! partitions. The node adds what surrounds both:
//!
//! Module map:
//! - [`ingest_thread`]: [`IngestThread`], the one thread that reads the owned partitions and
//!   applies them in offset order (a panic applying one record halts that partition), and
//!   partition replacement for repair and recovery.
//! - [`watermarks`]: the watermark thread beside it: lag, rewinds, the topic's partition count,
//!   broker contact (written to `prefixlog_query::ReplicaStatus`).
//! - [`options`]: [`NodeOptions`]: ports, data dir, checkpoint policy, peers, gap and
//!   settings-change choices, shutdown grace (nothing that changes applied state).
//! - [`startup`]: choose the starting state (local checkpoint, peer bootstrap, log start) and
//!   prove the log continues it, or refuse to start.
//! - [`progress`]: [`progress::StartupProgress`], the start-up phase on `/metrics` and
//!   `/readyz` while the state is restored (the admin port is up before the query port).
//! - [`recovery`]: recover partitions the log stopped continuing, from peers' checkpoints.
//! - [`checkpoints`]: the checkpoint loop and its metrics.
//! - [`node`]: [`ReplicaNode`]: start, accessors, clean [`ReplicaNode::shutdown`].
//! - [`error`]: [`NodeError`], why a replica did not start or stop cleanly.

pub mod checkpoints;
pub mod error;
pub mod ingest_thread;
pub mod node;
pub mod options;
pub mod progress;
pub mod recovery;
pub mod startup;
pub mod watermarks;

pub use error::NodeError;
pub use ingest_thread::{GapPolicy, IngestError, IngestOptions, IngestThread};
pub use node::{ReplicaNode, Stopped};
pub use options::{CheckpointPolicy, GapChoice, NodeOptions, SettingsChange};
pub use startup::StateSource;

/// A loopback port that is free now, for a server to be started on it (tests, the demo: a
/// replica's peers must know its port before it starts).
///
/// Below the kernel's ephemeral range (32768–60999 on Linux) on purpose: binding port 0 hands
/// out a port *in* that range, and clients that keep reconnecting to endpoints not listening yet
/// (librdkafka during a broker outage, ZMQ sockets) open outgoing connections from ephemeral
/// ports too — one of them can take such a port before the server binds it.
pub fn loopback_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Processes (test binaries run side by side) start at different offsets.
    let start = std::process::id().wrapping_mul(7_919) % 14_000;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 14_000, "no free loopback port in 18000-31999");
        let port = 18_000 + (start + n) % 14_000;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
}

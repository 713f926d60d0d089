//! How a replica runs: everything that does not change its applied state (that is the
//! `LogSpec`'s `StateSettings`). Defaults suit tests and embedded use: every port on loopback
//! with an OS-chosen number, no data dir, no peers. The CLI sets every field explicitly.

use prefixlog_query::{QueryConfig, TlsFiles};
use prefixlog_snapshot::Retention;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// When checkpoints are taken and how many are kept.
#[derive(Clone, Debug)]
pub struct CheckpointPolicy {
    /// Take one this often (wall time; zero: no timer).
    pub interval: Duration,
    /// Also take one after this many records (applied or skipped; 0: never).
    pub records: u64,
    pub retention: Retention,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        Self { interval: Duration::from_secs(60), records: 1_000_000, retention: Retention::default() }
    }
}

/// What a replica does when the log does not continue its state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GapChoice {
    /// Refuse to start (or halt the partition at run time) unless a peer's checkpoint that the
    /// log continues can replace the state. The default: never serve a state it cannot prove.
    #[default]
    Refuse,
    /// Read on from the log's first offset and mark the partition's holders gapped
    /// (`--accept-log-gaps`, an operator's explicit choice).
    Accept,
}

/// What a replica does with a checkpoint of the same log applied with other settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SettingsChange {
    /// Refuse to start, naming the differences.
    #[default]
    Refuse,
    /// Ignore such checkpoints and replay the log from the start (`--replay-on-settings-change`).
    Replay,
}

#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Reported in every answer (default: the host name).
    pub replica_id: String,
    /// gRPC query port.
    pub grpc_addr: SocketAddr,
    /// Admin HTTP port (/metrics, /healthz, /readyz); `None`: none.
    pub admin_addr: Option<SocketAddr>,
    /// Replica-to-replica port (digests, checkpoint transfer); `None`: none.
    pub peer_addr: Option<SocketAddr>,
    /// Mutual TLS on the peer port and to peers (the checkpoint stream is the whole index).
    pub peer_tls: Option<prefixlog_peer::PeerTls>,
    pub tls: Option<TlsFiles>,
    /// Ready once the total lag is at most this many records.
    pub ready_lag: i64,
    /// Answers without a consistency token say `stale` once the broker has not answered for
    /// longer than this (`--stale-after`).
    pub stale_after: Duration,
    pub query: QueryConfig,
    /// Checkpoint store directory; `None`: no checkpoints (every start replays the log).
    pub data_dir: Option<PathBuf>,
    pub checkpoints: CheckpointPolicy,
    /// Other replicas of the same shard (their peer ports): anti-entropy, and where a partition
    /// whose log was cut is recovered from.
    pub peers: Vec<String>,
    pub anti_entropy_interval: Duration,
    /// Deadline of every call to a peer for digests (connecting included): a slow or hung peer
    /// is reported unreachable after it, and never delays the comparison with the others.
    pub peer_timeout: Duration,
    /// Checkpoint transfers this replica serves at once on its peer port; one more is refused
    /// with RESOURCE_EXHAUSTED (the caller asks another replica or retries).
    pub peer_checkpoint_transfers: usize,
    /// Scrubbing: bounded checks of the structures that answer queries against the digests.
    pub scrub: prefixlog_peer::ScrubOptions,
    /// With no usable local checkpoint, fetch this peer's newest first.
    pub bootstrap_from: Option<String>,
    /// Append a tick to every owned partition this often (zero: never).
    pub tick_interval: Duration,
    pub dead_letter_topic: Option<String>,
    pub gaps: GapChoice,
    pub settings_change: SettingsChange,
    /// How long a clean stop waits for in-flight queries.
    pub shutdown_grace: Duration,
    /// Pin the ingest thread and its Kafka consumer's threads to these CPUs (`--ingest-cpus`);
    /// `None`: unpinned.
    pub ingest_cpus: Option<prefixlog_ingest::CpuSet>,
    /// Keep two copies of every keyspace so queries never wait on a write (`--query-copy`):
    /// twice the engine's memory and write work. Answers, digests and checkpoints are the same.
    pub query_copy: bool,
    /// More services on the query port (the protocol facades, e.g. `serve --sgl-model`).
    pub extensions: prefixlog_query::Extensions,
}

impl Default for NodeOptions {
    fn default() -> Self {
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        Self {
            replica_id: prefixlog_query::default_replica_id(),
            grpc_addr: any,
            admin_addr: Some(any),
            peer_addr: Some(any),
            peer_tls: None,
            tls: None,
            ready_lag: 1000,
            stale_after: prefixlog_query::health::DEFAULT_STALE_AFTER,
            query: QueryConfig::default(),
            data_dir: None,
            checkpoints: CheckpointPolicy::default(),
            peers: Vec::new(),
            anti_entropy_interval: Duration::from_secs(10),
            peer_timeout: Duration::from_secs(10),
            peer_checkpoint_transfers: 2,
            scrub: prefixlog_peer::ScrubOptions::default(),
            bootstrap_from: None,
            tick_interval: Duration::ZERO,
            dead_letter_topic: None,
            gaps: GapChoice::Refuse,
            settings_change: SettingsChange::Refuse,
            shutdown_grace: Duration::from_secs(5),
            ingest_cpus: None,
            query_copy: false,
            extensions: prefixlog_query::Extensions::default(),
        }
    }
}

impl NodeOptions {
    /// How this replica calls its peers: the peer port's mutual TLS when configured, the
    /// call deadline, the default size caps. Every peer client (anti-entropy, bootstrap,
    /// recovery) is made from it.
    pub fn peer_client(&self) -> prefixlog_peer::PeerClient {
        prefixlog_peer::PeerClient {
            tls: self.peer_tls.as_ref().map(prefixlog_peer::PeerTls::client),
            call_timeout: self.peer_timeout,
            ..Default::default()
        }
    }

    /// Peers to fetch a checkpoint from, in order: `bootstrap_from`, then `peers`.
    pub fn checkpoint_sources(&self) -> Vec<String> {
        let mut v: Vec<String> = self.bootstrap_from.iter().cloned().collect();
        v.extend(self.peers.iter().filter(|p| Some(*p) != self.bootstrap_from.as_ref()).cloned());
        v
    }
}

//! Why a replica could not start or stop cleanly.

use prefixlog_ingest::continuity::OffsetProblem;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("invalid state settings: {0}")]
    Settings(#[from] prefixlog_state::settings::SettingsError),
    #[error(transparent)]
    Probe(#[from] prefixlog_ingest::ProbeError),
    #[error(
        "topic {topic:?} has cleanup.policy={policy}: compaction drops a worker's earlier records and \
         replicas would apply its newest ones without them. prefixlog's topic must use \
         cleanup.policy=delete (size/time retention), never compact"
    )]
    CompactedTopic { topic: String, policy: String },
    #[error("data dir {dir}: {source}")]
    DataDir { dir: PathBuf, source: std::io::Error },
    #[error("opening the checkpoint store in {dir}: {source}")]
    Store { dir: PathBuf, source: prefixlog_snapshot::StoreError },
    #[error(transparent)]
    Restore(#[from] prefixlog_snapshot::RestoreError),
    #[error(transparent)]
    Fetch(#[from] prefixlog_peer::FetchError),
    #[error(
        "checkpoint {checkpoint} of this log was applied with other state settings ({}); refusing to \
         start: restart with the same settings, or with --replay-on-settings-change to replay the \
         log with the new ones",
        differences.join(", ")
    )]
    SettingsChanged { checkpoint: u64, differences: Vec<String> },
    #[error(
        "the log does not continue this replica's state: {}. Refusing to start (it would serve a \
         state it cannot prove). Remedies: --bootstrap-from PEER or --peers (take these partitions \
         from a replica whose checkpoint the log still covers); or --accept-log-gaps (start anyway: \
         read on from the log's first offset with these partitions' holders marked gapped)",
        problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    LogDoesNotContinue { problems: Vec<OffsetProblem> },
    #[error("peer {peer}: its checkpoint is not continued by the log either: {problem}")]
    PeerNotContinued { peer: String, problem: OffsetProblem },
    #[error(transparent)]
    Ingest(#[from] crate::ingest_thread::IngestError),
    #[error(transparent)]
    MarkCheck(#[from] prefixlog_ingest::continuity::MarkCheckError),
    #[error("binding {what} {addr}: {source}")]
    Bind { what: &'static str, addr: std::net::SocketAddr, source: std::io::Error },
    #[error("query server: {0}")]
    Query(#[from] prefixlog_query::ServerError),
    #[error("peer port TLS: {0}")]
    PeerTls(#[source] tonic::transport::Error),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("publisher: {0}")]
    Publish(#[from] prefixlog_ingest::PublishError),
    #[error("final checkpoint: {0}")]
    FinalCheckpoint(prefixlog_snapshot::StoreError),
    #[error("a background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("no peer to bootstrap from (--bootstrap-from or --peers names none)")]
    NoBootstrapPeer,
}

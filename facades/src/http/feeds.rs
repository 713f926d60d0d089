//! What the Dynamo facade's `/register` needs from the engine side, without linking it: a
//! replica subscribes to a registered engine's KV event stream and writes its records to the
//! log. The facade decides *which* feeds run ([`super::listeners`]); an [`EngineFeeds`] given
//! by the binary runs them (`prefixlog serve` passes one built on `prefixlog_bridge`), so this
//! crate links neither ZeroMQ nor Kafka.

use prefixlog_engine::KeyspaceId;
use prefixlog_state::LogAppend;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::watch;

/// One engine feed to subscribe to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedStart {
    pub keyspace: KeyspaceId,
    pub worker: u64,
    pub dp_rank: u32,
    /// The engine's PUB endpoint.
    pub endpoint: String,
    /// The engine's replay endpoint, if it has one.
    pub replay_endpoint: Option<String>,
    /// The epoch of the subscription's first session (above every epoch the feed has seen).
    pub start_epoch: u64,
}

/// A started feed: the future that runs it until its stop signal turns true (an error ends
/// it early), and how many epochs it has moved up since it started (one per engine restart and
/// one per start-over after a gap or a lost message).
pub struct StartedFeed {
    pub run: Pin<Box<dyn Future<Output = Result<(), String>> + Send>>,
    pub epochs_moved: Arc<dyn Fn() -> u64 + Send + Sync>,
}

/// Runs engine feeds for the Dynamo facade's registrations.
pub trait EngineFeeds: Send + Sync {
    /// Where registrations and cleared feeds are written.
    fn log(&self) -> Arc<dyn LogAppend>;
    /// Registers the feeds' metrics with the replica's registry (once, at start).
    fn register_metrics(&self, registry: &prometheus::Registry) -> prometheus::Result<()>;
    /// Starts `feed`; it runs until `stop` turns true.
    fn start(&self, feed: FeedStart, stop: watch::Receiver<bool>) -> StartedFeed;
    /// `feed`'s subscription ended (stopped or aborted): its metrics go.
    fn ended(&self, worker: u64, endpoint: &str);
}

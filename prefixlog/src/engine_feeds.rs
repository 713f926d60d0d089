//! The engine feeds the Dynamo HTTP facade's `/register` runs, on the bridge's engine stream:
//! one `prefixlog_bridge::EngineBridge` per registered (instance, dp rank), written to the log
//! through a Kafka producer. The facade decides which feeds run; this runs them.

use prefixlog_bridge::metrics::BridgeCollector;
use prefixlog_bridge::{BridgeOptions, EngineBridge, EngineSpec};
use prefixlog_facades::http::feeds::{EngineFeeds, FeedStart, StartedFeed};
use prefixlog_ingest::Publisher;
use prefixlog_state::LogAppend;
use std::sync::Arc;
use tokio::sync::watch;

/// Engine feeds on the bridge, publishing with one producer; their metrics are the bridge's.
pub struct BridgeFeeds {
    publisher: Publisher,
    collector: Arc<BridgeCollector>,
}

impl BridgeFeeds {
    pub fn new(publisher: Publisher) -> Self {
        Self { publisher, collector: Arc::new(BridgeCollector::default()) }
    }
}

impl EngineFeeds for BridgeFeeds {
    fn log(&self) -> Arc<dyn LogAppend> {
        Arc::new(self.publisher.clone())
    }

    fn register_metrics(&self, registry: &prometheus::Registry) -> prometheus::Result<()> {
        self.collector.register(registry)
    }

    fn start(&self, feed: FeedStart, stop: watch::Receiver<bool>) -> StartedFeed {
        let mut opts = BridgeOptions::new(feed.keyspace);
        opts.start_epoch = feed.start_epoch;
        let spec = EngineSpec {
            endpoint: feed.endpoint.clone(),
            replay_endpoint: feed.replay_endpoint,
            worker: feed.worker,
            dp_rank: Some(feed.dp_rank),
            topic: String::new(),
        };
        let bridge = EngineBridge::new(spec, opts, self.publisher.clone());
        let metrics = bridge.metrics();
        self.collector.add(feed.worker, &feed.endpoint, metrics.clone());
        StartedFeed {
            run: Box::pin(async move { bridge.run(stop).await.map_err(|e| format!("{e:#}")) }),
            epochs_moved: Arc::new(move || metrics.epochs_moved()),
        }
    }

    fn ended(&self, worker: u64, endpoint: &str) {
        self.collector.remove(worker, endpoint);
    }
}

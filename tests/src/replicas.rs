//! Replicas for the cross-crate tests, started the one way every replica starts
//! (`prefixlog_node::ReplicaNode`): same start-up checks, continuity checks, metrics and ports.

use prefixlog_ingest::{KafkaConnection, LogSpec};
use prefixlog_node::{NodeOptions, ReplicaNode};

/// The log `topic` of `partitions` partitions at `brokers`, default settings, every partition.
pub fn spec(brokers: &str, topic: &str, partitions: u32) -> LogSpec {
    LogSpec::new(KafkaConnection::new(brokers), topic, partitions)
}

/// Test defaults: every port on loopback with an OS-chosen number, no data dir, no peers.
pub fn options(replica_id: &str) -> NodeOptions {
    NodeOptions { replica_id: replica_id.to_string(), ..NodeOptions::default() }
}

/// A replica of `spec` with [`options`].
pub async fn replica(spec: &LogSpec, replica_id: &str) -> ReplicaNode {
    ReplicaNode::start(spec.clone(), options(replica_id)).await.expect("replica starts")
}

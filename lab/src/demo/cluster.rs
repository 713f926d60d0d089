//! The demo's cluster, all in this process: the embedded broker and two replicas (each a
//! `ReplicaNode`: ingest, query gRPC server, peer service, anti-entropy against the other).

use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};

use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_state::{NextOffset, StateSettings};
use std::net::SocketAddr;
use std::time::Duration;

pub const TOPIC: &str = "prefixlog.demo";

pub struct Cluster {
    pub nodes: Vec<ReplicaNode>,
    pub spec: LogSpec,
    /// Last: the broker must outlive its clients ([`Cluster::shutdown`]).
    kafka: EmbeddedKafka,
}

/// Digest points every this many offsets (the default 1,000 would give the demo's short
/// partitions no point to compare). Every replica of a log uses the same value.
const DIGEST_INTERVAL: u64 = 16;

impl Cluster {
    pub async fn start(
        partitions: u32,
        replicas: usize,
        anti_entropy_every: Duration,
        smg_facade: bool,
    ) -> anyhow::Result<Self> {
        let kafka = EmbeddedKafka::start(TOPIC, partitions)?;
        let settings = StateSettings { digest_interval: DIGEST_INTERVAL, ..Default::default() };
        let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), TOPIC, partitions)
            .with_settings(settings);
        // Each replica's anti-entropy needs the others' peer addresses before they start.
        let peer_addrs: Vec<SocketAddr> = (0..replicas)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], prefixlog_node::loopback_port())))
            .collect();
        let mut nodes = Vec::new();
        for (i, addr) in peer_addrs.iter().enumerate() {
            let mut extensions = prefixlog_query::Extensions::default();
            if smg_facade {
                let log = std::sync::Arc::new(prefixlog_ingest::Publisher::new(&spec)?);
                extensions.0.push(std::sync::Arc::new(prefixlog_facades::smg::SmgExtension::new(log)));
            }
            let opts = NodeOptions {
                extensions,
                replica_id: format!("demo-replica-{i}"),
                admin_addr: None,
                peer_addr: Some(*addr),
                peers: peer_addrs.iter().filter(|a| *a != addr).map(ToString::to_string).collect(),
                anti_entropy_interval: anti_entropy_every,
                ..NodeOptions::default()
            };
            nodes.push(ReplicaNode::start(spec.clone(), opts).await?);
        }
        Ok(Self { nodes, spec, kafka })
    }

    /// gRPC endpoints of the query servers, as `IndexClient` wants them.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(ReplicaNode::endpoint).collect()
    }

    /// One anti-entropy round on every replica now.
    pub async fn anti_entropy_round(&self) {
        for n in &self.nodes {
            n.anti_entropy_round().await;
        }
    }

    /// Stops the replicas, then the broker: a consumer that outlives its broker logs a
    /// connection error per retry. The clients of the demo (gateways, fleet publishers) must
    /// be gone before this is called, for the same reason.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        for n in self.nodes {
            n.shutdown().await?;
        }
        // Probes and bounded replays close their clients on threads of their own.
        tokio::task::spawn_blocking(prefixlog_ingest::log_spec::wait_for_closing_clients).await?;
        drop(self.kafka);
        Ok(())
    }

    /// Waits until every replica applied everything below `token` (next offsets).
    pub async fn wait_caught_up(&self, token: &[NextOffset], timeout: Duration) -> bool {
        let mut ok = true;
        for n in &self.nodes {
            ok &= n.status().wait_for(token, timeout).await;
        }
        ok
    }
}

//! The demo's cluster, all in this process: the embedded broker, two replicas (ingest +
//! query gRPC server + peer service), and anti-entropy between them.

use prefixlog_engine::{Engine, EngineConfig};
use prefixlog_ingest::{Applier, ApplyConfig, EmbeddedKafka, Replica, ReplicaConfig, ReplicaStatus};
use prefixlog_peer::{AntiEntropy, AntiEntropyStats, PeerService, RepairContext};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub const TOPIC: &str = "prefixlog.demo";

pub struct ReplicaNode {
    pub engine: Arc<Engine>,
    pub replica: Replica,
    pub query: prefixlog_query::RunningServer,
    pub anti_entropy: Arc<AntiEntropy>,
}

impl ReplicaNode {
    pub fn status(&self) -> &Arc<ReplicaStatus> {
        self.replica.status()
    }

    pub fn records_applied(&self) -> u64 {
        self.status().records_applied.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> &Arc<AntiEntropyStats> {
        &self.anti_entropy.stats
    }
}

pub struct Cluster {
    pub nodes: Vec<ReplicaNode>,
    pub brokers: String,
    /// Last: the broker must outlive its clients.
    _kafka: EmbeddedKafka,
}

/// Digest points every this many offsets (the default 1,000 would give the demo's short
/// partitions no point to compare). Every replica of a log uses the same value.
const DIGEST_EVERY: i64 = 16;

impl Cluster {
    pub async fn start(partitions: u32, replicas: usize) -> anyhow::Result<Self> {
        let kafka = EmbeddedKafka::start(TOPIC, partitions)?;
        let brokers = kafka.bootstrap_servers();
        let engine_cfg = EngineConfig { partitions, ..Default::default() };
        let apply_cfg = ApplyConfig { partitions, digest_every: DIGEST_EVERY, ..Default::default() };
        let log =
            ReplicaConfig { brokers: brokers.clone(), topic: TOPIC.into(), partitions, properties: vec![] };
        // Bind every peer port first: each replica's anti-entropy needs the others' addresses.
        let mut listeners = Vec::new();
        for _ in 0..replicas {
            listeners.push(tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?);
        }
        let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr()).collect::<Result<_, _>>()?;
        let mut nodes = Vec::new();
        for (i, listener) in listeners.into_iter().enumerate() {
            let engine = Arc::new(Engine::new(engine_cfg.clone()));
            let applier = Applier::new(engine.clone(), apply_cfg.clone());
            let replica = Replica::start(log.clone(), applier)?;
            let replica_id = format!("demo-replica-{i}");
            let query = prefixlog_query::start(
                prefixlog_query::ServerConfig {
                    grpc_addr: ([127, 0, 0, 1], 0).into(),
                    admin_addr: None,
                    query: prefixlog_query::QueryConfig {
                        replica_id: replica_id.clone(),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                engine.clone(),
                replica.status().clone(),
                Some(replica.applier().clone()),
            )
            .await?;
            let svc = PeerService {
                applier: replica.applier().clone(),
                store: None,
                replica_id,
                topic: TOPIC.into(),
            };
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(svc.into_server())
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
            );
            let anti_entropy = Arc::new(AntiEntropy {
                applier: replica.applier().clone(),
                peers: addrs.iter().filter(|a| **a != addrs[i]).map(|a| a.to_string()).collect(),
                ctx: RepairContext {
                    store: None,
                    log: log.clone(),
                    engine_cfg: engine_cfg.clone(),
                    apply_cfg: apply_cfg.clone(),
                },
                stats: Arc::new(AntiEntropyStats::default()),
            });
            nodes.push(ReplicaNode { engine, replica, query, anti_entropy });
        }
        Ok(Self { nodes, brokers, _kafka: kafka })
    }

    /// gRPC endpoints of the query servers, as `IndexClient` wants them.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("http://{}", n.query.grpc_addr)).collect()
    }

    /// Runs anti-entropy rounds on every replica every `every`, until the cluster is dropped.
    pub fn spawn_anti_entropy(&self, every: Duration) {
        for n in &self.nodes {
            let ae = Arc::downgrade(&n.anti_entropy);
            tokio::spawn(async move {
                let mut t = tokio::time::interval(every);
                t.tick().await;
                loop {
                    t.tick().await;
                    let Some(ae) = ae.upgrade() else { return };
                    ae.round().await;
                }
            });
        }
    }

    /// One anti-entropy round on every replica now.
    pub async fn anti_entropy_round(&self) {
        for n in &self.nodes {
            n.anti_entropy.round().await;
        }
    }

    /// Waits until every replica applied everything below `token` (per-partition offsets).
    pub async fn wait_caught_up(&self, token: &[(u32, i64)], timeout: Duration) -> bool {
        let mut ok = true;
        for n in &self.nodes {
            ok &= n.status().wait_for(token, timeout).await;
        }
        ok
    }
}

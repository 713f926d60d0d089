//! The demo's cluster, all in this process: the embedded broker and the replicas (each a
//! `ReplicaNode`: ingest, query gRPC server, peer service, anti-entropy against the others).
//! With a data root (`--faults`), every replica keeps a fixed query port and its own data dir,
//! so that it can be stopped cleanly, killed, restarted or wiped while gateways keep their
//! endpoint list ([`Cluster::stop`], [`Cluster::kill`], [`Cluster::restart`]). With several
//! brokers, the one leading every partition can be stopped and leadership moved to another
//! ([`Cluster::stop_broker`], [`Cluster::elect_leader`], [`Cluster::start_broker`]).

use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};

use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_state::{NextOffset, StateSettings};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub const TOPIC: &str = "prefixlog.demo";

pub struct Cluster {
    pub nodes: Vec<ReplicaNode>,
    pub spec: LogSpec,
    /// How each replica starts (and restarts).
    opts: Vec<NodeOptions>,
    /// Last: the broker must outlive its clients ([`Cluster::shutdown`]).
    kafka: EmbeddedKafka,
}

/// Digest points every this many offsets (the default 1,000 would give the demo's short
/// partitions no point to compare). Every replica of a log uses the same value.
const DIGEST_INTERVAL: u64 = 16;

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], prefixlog_node::loopback_port()))
}

impl Cluster {
    /// `data_root`: each replica gets a fixed query port and a data dir under it (checkpoints,
    /// final checkpoint on a clean stop); None: ephemeral ports, no disk (the calm demo).
    pub async fn start(
        partitions: u32,
        replicas: usize,
        anti_entropy_every: Duration,
        smg_facade: bool,
        data_root: Option<PathBuf>,
        brokers: u8,
    ) -> anyhow::Result<Self> {
        let kafka = EmbeddedKafka::start_replicated(TOPIC, partitions, brokers)?;
        let settings = StateSettings { digest_interval: DIGEST_INTERVAL, ..Default::default() };
        let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), TOPIC, partitions)
            .with_settings(settings);
        // Each replica's anti-entropy needs the others' peer addresses before they start.
        let peer_addrs: Vec<SocketAddr> = (0..replicas).map(|_| loopback()).collect();
        let mut opts = Vec::new();
        for (i, addr) in peer_addrs.iter().enumerate() {
            let mut extensions = prefixlog_query::Extensions::default();
            if smg_facade {
                let log = std::sync::Arc::new(prefixlog_ingest::Publisher::new(&spec)?);
                extensions.0.push(std::sync::Arc::new(prefixlog_facades::smg::SmgExtension::new(log)));
            }
            let mut o = NodeOptions {
                extensions,
                replica_id: format!("demo-replica-{i}"),
                admin_addr: None,
                peer_addr: Some(*addr),
                peers: peer_addrs.iter().filter(|a| *a != addr).map(ToString::to_string).collect(),
                anti_entropy_interval: anti_entropy_every,
                ..NodeOptions::default()
            };
            if let Some(root) = &data_root {
                o.grpc_addr = loopback();
                o.data_dir = Some(root.join(&o.replica_id));
                o.shutdown_grace = Duration::from_secs(2);
            }
            opts.push(o);
        }
        let mut nodes = Vec::new();
        for o in &opts {
            nodes.push(ReplicaNode::start(spec.clone(), o.clone()).await?);
        }
        Ok(Self { nodes, spec, opts, kafka })
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

    /// Replica `i`'s clean stop (what SIGTERM does: NOT_SERVING, stop consuming, final
    /// checkpoint, in-flight queries finish). Whether a final checkpoint was written.
    /// The replica must be started again ([`Self::restart`]) before anything else uses it.
    pub async fn stop(&mut self, i: usize) -> anyhow::Result<bool> {
        let stopped = self.nodes.remove(i).shutdown().await?;
        Ok(stopped.final_checkpoint.is_some())
    }

    /// Replica `i` dies (kill -9: nothing written, ports closed).
    pub async fn kill(&mut self, i: usize) {
        self.nodes.remove(i).kill().await;
    }

    /// Starts replica `i` again (after [`Self::stop`] or [`Self::kill`]) on its port and data
    /// dir, from an empty disk if `wipe`. Retries while its port is still held by the old one.
    pub async fn restart(&mut self, i: usize, wipe: bool) -> anyhow::Result<()> {
        let o = self.opts[i].clone();
        if let (true, Some(dir)) = (wipe, &o.data_dir) {
            if dir.exists() {
                std::fs::remove_dir_all(dir)?;
            }
        }
        let t = Instant::now();
        let node = loop {
            match ReplicaNode::start(self.spec.clone(), o.clone()).await {
                Ok(n) => break n,
                Err(e) if t.elapsed() < Duration::from_secs(30) => {
                    tracing::debug!(replica = i, error = %e, "restart: retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.nodes.insert(i, node);
        Ok(())
    }

    /// Waits until every replica says ready (`/readyz`: caught up to within its ready lag).
    pub async fn wait_all_ready(&self, timeout: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if self.nodes.iter().all(|n| n.ready().0) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Stops the replicas, then the broker: a consumer that outlives its broker logs a
    /// connection error per retry. The clients of the demo (gateways, fleet publishers) must
    /// be gone before this is called, for the same reason.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        // No replica's rounds may find another one already stopped (a warning in the calm demo).
        for n in &self.nodes {
            n.stop_anti_entropy_rounds();
        }
        for n in self.nodes {
            n.shutdown().await?;
        }
        // The kept options hold the SMG facades' publishers: clients of the broker too.
        drop(self.opts);
        // Probes and bounded replays close their clients on threads of their own.
        tokio::task::spawn_blocking(prefixlog_ingest::log_spec::wait_for_closing_clients).await?;
        drop(self.kafka);
        Ok(())
    }

    /// Stops broker `id` (the leader of every partition until [`Self::elect_leader`]).
    pub fn stop_broker(&self, id: u8) -> anyhow::Result<()> {
        Ok(self.kafka.set_broker_reachable(id, false)?)
    }

    /// Starts broker `id` again (a follower now, if leadership moved away).
    pub fn start_broker(&self, id: u8) -> anyhow::Result<()> {
        Ok(self.kafka.set_broker_reachable(id, true)?)
    }

    /// Broker `id` becomes the leader of every partition (the controller's election).
    pub fn elect_leader(&self, id: u8) -> anyhow::Result<()> {
        Ok(self.kafka.move_leaders(TOPIC, self.spec.partitions, id)?)
    }

    /// The log's end now: the next offset of every partition, as the broker says.
    pub async fn log_end(&self) -> anyhow::Result<Vec<NextOffset>> {
        let spec = self.spec.clone();
        let probe = tokio::task::spawn_blocking(move || prefixlog_ingest::probe_log(&spec)).await??;
        Ok(probe.watermarks.iter().map(|(&p, w)| NextOffset::new(p, w.high)).collect())
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

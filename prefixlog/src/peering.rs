//! `serve`'s replica-to-replica side: the `ReplicaPeer` server, anti-entropy rounds against
//! `--peers`, and bootstrap of an empty replica from a peer's checkpoint.

use crate::checkpointing::Checkpoints;
use parking_lot::Mutex;
use prefixlog_engine::EngineConfig;
use prefixlog_ingest::{Applier, ApplyConfig, ReplicaConfig};
use prefixlog_peer::{AntiEntropy, AntiEntropyStats, PeerService, RepairContext};
use prefixlog_snapshot::{newest_usable, CheckpointStore};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Clone, Debug)]
pub struct PeerArgs {
    /// Address of the replica-to-replica gRPC service (digests, checkpoint transfer).
    #[arg(long, env = "PREFIXLOG_PEER_ADDR", default_value = "127.0.0.1:50152")]
    pub peer_addr: std::net::SocketAddr,
    /// Other replicas' --peer-addr, comma separated: compared by anti-entropy.
    #[arg(long, env = "PREFIXLOG_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// How often anti-entropy compares digests with every peer.
    #[arg(long, default_value = "10s", value_parser = crate::serve::humantime_secs)]
    pub anti_entropy_interval: Duration,
    /// With an empty (or unusable) checkpoint store, fetch the newest checkpoint of this peer
    /// first (requires --data-dir), so the log need not be retained from the beginning.
    #[arg(long)]
    pub bootstrap_from: Option<String>,
}

pub async fn maybe_bootstrap(a: &PeerArgs, c: Option<&Checkpoints>) -> anyhow::Result<()> {
    let Some(peer) = &a.bootstrap_from else { return Ok(()) };
    let c = c.ok_or_else(|| {
        anyhow::anyhow!("--bootstrap-from needs --data-dir (where to store the checkpoint)")
    })?;
    if newest_usable(&c.store, &c.identity, &c.high_watermarks).0.is_some() {
        tracing::info!(%peer, "a usable local checkpoint exists: not bootstrapping from the peer");
        return Ok(());
    }
    tracing::info!(%peer, "bootstrapping: fetching the peer's newest checkpoint");
    let meta = prefixlog_peer::fetch_checkpoint(peer, &c.store).await?;
    tracing::info!(checkpoint = meta.id, holder_blocks = meta.holder_blocks(), "bootstrap checkpoint stored");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub async fn start(
    a: &PeerArgs,
    replica_id: String,
    applier: Arc<Mutex<Applier>>,
    store: Option<Arc<CheckpointStore>>,
    log: ReplicaConfig,
    engine_cfg: EngineConfig,
    apply_cfg: ApplyConfig,
) -> anyhow::Result<Arc<AntiEntropyStats>> {
    let svc =
        PeerService { applier: applier.clone(), store: store.clone(), replica_id, topic: log.topic.clone() };
    let listener = tokio::net::TcpListener::bind(a.peer_addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding --peer-addr {}: {e}", a.peer_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "replica peer service listening");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc.into_server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let stats = Arc::new(AntiEntropyStats::default());
    if let Err(e) = AntiEntropyCollector::register(stats.clone()) {
        tracing::warn!(error = %e, "anti-entropy metrics not registered");
    }
    if !a.peers.is_empty() {
        let ae = AntiEntropy {
            applier,
            peers: a.peers.clone(),
            ctx: RepairContext { store, log, engine_cfg, apply_cfg },
            stats: stats.clone(),
        };
        tracing::info!(peers = ?a.peers, every = ?a.anti_entropy_interval, "anti-entropy enabled");
        tokio::spawn(ae.run(a.anti_entropy_interval));
    }
    Ok(stats)
}

/// Exposes [`AntiEntropyStats`] as `prefixlog_anti_entropy_*` metrics, read at scrape time.
pub struct AntiEntropyCollector {
    stats: Arc<AntiEntropyStats>,
    descs: Vec<prometheus::core::Desc>,
}

impl AntiEntropyCollector {
    pub fn register(stats: Arc<AntiEntropyStats>) -> prometheus::Result<()> {
        let descs = Self::metrics(&AntiEntropyStats::default())
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned().collect::<Vec<_>>())
            .collect();
        prometheus::register(Box::new(Self { stats, descs }))
    }

    fn metrics(s: &AntiEntropyStats) -> Vec<Box<dyn prometheus::core::Collector>> {
        use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts};
        use std::sync::atomic::Ordering::Relaxed;
        let c = |name: &str, help: &str, v: u64| {
            let m = IntCounter::new(name, help).expect("valid metric");
            m.inc_by(v);
            Box::new(m) as Box<dyn prometheus::core::Collector>
        };
        let mismatches = IntCounterVec::new(
            Opts::new("prefixlog_anti_entropy_mismatches_total", "Digest mismatches found, per partition"),
            &["partition"],
        )
        .expect("valid metric");
        for (p, n) in s.mismatches.lock().iter() {
            mismatches.with_label_values(&[&p.to_string()]).inc_by(*n);
        }
        let unreachable = IntCounterVec::new(
            Opts::new(
                "prefixlog_anti_entropy_peer_unreachable_total",
                "Rounds in which a peer could not be reached",
            ),
            &["peer"],
        )
        .expect("valid metric");
        let last = IntGaugeVec::new(
            Opts::new(
                "prefixlog_anti_entropy_last_success_unix_ms",
                "Last successful comparison with a peer",
            ),
            &["peer"],
        )
        .expect("valid metric");
        for (peer, (u, t)) in s.peers.lock().iter() {
            unreachable.with_label_values(&[peer]).inc_by(*u);
            last.with_label_values(&[peer]).set(*t as i64);
        }
        vec![
            c("prefixlog_anti_entropy_rounds_total", "Anti-entropy rounds run", s.rounds.load(Relaxed)),
            c(
                "prefixlog_anti_entropy_points_compared_total",
                "Digest points compared",
                s.points_compared.load(Relaxed),
            ),
            c(
                "prefixlog_anti_entropy_repairs_total",
                "Partitions rebuilt after a failed self-check",
                s.repairs.load(Relaxed),
            ),
            Box::new(mismatches),
            Box::new(unreachable),
            Box::new(last),
        ]
    }
}

impl prometheus::core::Collector for AntiEntropyCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        Self::metrics(&self.stats).iter().flat_map(|c| c.collect()).collect()
    }
}

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

//! `prefixlog serve`: an index replica.

use crate::kafka_args::KafkaArgs;
use prefixlog_engine::{Engine, EngineConfig};
use prefixlog_ingest::{
    Applier, ApplyConfig, EmbeddedKafka, Publisher, PublisherConfig, Replica, ReplicaConfig,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// How often to log progress (offsets, lag, state size).
    #[arg(long, default_value = "10s", value_parser = humantime_secs)]
    pub status_interval: Duration,
    /// Append a tick record to every partition this often (0 disables), so that log time —
    /// and with it placement expiry — advances on quiet partitions. Ticks are idempotent: any
    /// number of replicas may publish them.
    #[arg(long, default_value = "1s", value_parser = humantime_secs)]
    pub tick_interval: Duration,
    /// Copy every refused record (undecodable, unknown version, invalid) to this topic, bytes
    /// and key unchanged, with headers prefixlog-source-topic/-partition/-offset and
    /// prefixlog-reason. Best effort (never stalls ingest). Every replica that has it set
    /// copies the same records, and a restart copies the replayed tail's again (the headers
    /// identify duplicates): set it on one replica.
    #[arg(long, env = "PREFIXLOG_DEAD_LETTER_TOPIC")]
    pub dead_letter_topic: Option<String>,
    /// Directory of the RocksDB checkpoint store. Without it the replica keeps no checkpoints
    /// and replays the whole log on every start.
    #[arg(long, env = "PREFIXLOG_DATA_DIR")]
    pub data_dir: Option<std::path::PathBuf>,
    /// Take a checkpoint this often (wall time; 0 disables the timer).
    #[arg(long, default_value = "60s", value_parser = humantime_secs)]
    pub checkpoint_interval: Duration,
    /// Also take a checkpoint after this many applied records (0 disables).
    #[arg(long, default_value_t = 1_000_000)]
    pub checkpoint_records: u64,
    /// Retention: keep this many newest checkpoints...
    #[arg(long, default_value_t = 3)]
    pub keep_checkpoints: usize,
    /// ...plus the oldest checkpoint of every hour of log time within this many hours (audits).
    #[arg(long, default_value_t = 24)]
    pub keep_hourly_for: u64,
    /// Placement TTL in log time.
    #[arg(long, default_value = "120s", value_parser = humantime_secs)]
    pub placement_ttl: Duration,
    #[command(flatten)]
    pub query: QueryArgs,
    #[command(flatten)]
    pub peer: crate::peering::PeerArgs,
}

/// The query (gRPC) and admin (HTTP) ports.
#[derive(clap::Args)]
pub struct QueryArgs {
    /// gRPC query service address (PrefixIndex, health, reflection).
    #[arg(long, env = "PREFIXLOG_GRPC_ADDR", default_value = "127.0.0.1:50151")]
    pub grpc_addr: std::net::SocketAddr,
    /// Admin HTTP address (/metrics, /healthz, /readyz).
    #[arg(long, env = "PREFIXLOG_ADMIN_ADDR", default_value = "127.0.0.1:9151")]
    pub admin_addr: std::net::SocketAddr,
    /// Reported in every query response (default: the host name, else replica-<pid>).
    #[arg(long, env = "PREFIXLOG_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Ready (gRPC health SERVING, /readyz 200) once the total lag is at most this many records.
    #[arg(long, default_value_t = 1000)]
    pub ready_lag: i64,
    /// Serve gRPC over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Require client certificates signed by this CA (PEM): mutual TLS.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<std::path::PathBuf>,
}

pub fn humantime_secs(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = num.parse().map_err(|_| format!("expected a duration like 10s, 500ms or 2m, got {s:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("unknown duration unit in {s:?} (use ms, s or m)")),
    }
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let mut _embedded = None;
    let brokers = match &a.kafka.brokers {
        Some(b) => b.clone(),
        None => {
            let e = EmbeddedKafka::start(&a.kafka.topic, a.kafka.partitions)?;
            let b = e.bootstrap_servers();
            tracing::warn!(
                bootstrap = %b,
                topic = %a.kafka.topic,
                partitions = a.kafka.partitions,
                "no --brokers given: started librdkafka's embedded mock cluster in this process \
                 (development only: its log lives as long as this process; publishers can connect to {b})"
            );
            _embedded = Some(e);
            b
        }
    };
    let engine_cfg = EngineConfig {
        partitions: a.kafka.partitions,
        placement_ttl_ms: a.placement_ttl.as_millis() as u64,
        ..Default::default()
    };
    let apply_cfg = ApplyConfig { partitions: a.kafka.partitions, ..Default::default() };
    let replica_cfg = ReplicaConfig {
        brokers: brokers.clone(),
        topic: a.kafka.topic.clone(),
        partitions: a.kafka.partitions,
        properties: a.kafka.property.clone(),
    };
    let checkpoints = crate::checkpointing::open(&a, &replica_cfg)?;
    crate::peering::maybe_bootstrap(&a.peer, checkpoints.as_ref()).await?;
    let applier = match &checkpoints {
        Some(c) => crate::checkpointing::restore_or_fresh(c, engine_cfg.clone(), apply_cfg.clone())?,
        None => Applier::new(Arc::new(Engine::new(engine_cfg.clone())), apply_cfg.clone()),
    };
    let engine = applier.engine().clone();
    // What the state on disk covers, read before ingest can move it.
    let covered = applier.offsets();
    let replica = Replica::start_with(replica_cfg.clone(), applier, a.dead_letter_topic.as_deref())?;
    let store = checkpoints.as_ref().map(|c| c.store.clone());
    if let Some(c) = checkpoints {
        crate::checkpointing::spawn_loop(c, &a, replica.applier().clone(), covered);
    }
    tracing::info!(%brokers, topic = %a.kafka.topic, partitions = a.kafka.partitions, "replica started; Ctrl-C stops");
    let status = replica.status().clone();
    let replica_id = a.query.replica_id.clone().unwrap_or_else(prefixlog_query::service::default_replica_id);
    let _anti_entropy = crate::peering::start(
        &a.peer,
        replica_id.clone(),
        replica.applier().clone(),
        store,
        replica_cfg,
        engine_cfg,
        apply_cfg,
    )
    .await?;
    let _query = prefixlog_query::start(
        prefixlog_query::ServerConfig {
            grpc_addr: a.query.grpc_addr,
            admin_addr: Some(a.query.admin_addr),
            ready_lag: a.query.ready_lag,
            query: prefixlog_query::QueryConfig { replica_id, ..Default::default() },
            tls: a.query.tls_cert.clone().zip(a.query.tls_key.clone()).map(|(cert, key)| {
                prefixlog_query::TlsFiles { cert, key, client_ca: a.query.tls_client_ca.clone() }
            }),
            ..Default::default()
        },
        engine.clone(),
        status.clone(),
        Some(replica.applier().clone()),
    )
    .await?;
    if !a.tick_interval.is_zero() {
        let mut pc = PublisherConfig::new(&brokers, &a.kafka.topic, a.kafka.partitions);
        pc.properties = a.kafka.property.clone();
        let publisher = Publisher::new(pc)?;
        let every = a.tick_interval;
        tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            loop {
                t.tick().await;
                if let Err(e) = publisher.publish_ticks(None).await {
                    tracing::warn!(error = %e, "publishing ticks failed; log time may stall on quiet partitions");
                }
            }
        });
    }
    let mut tick = tokio::time::interval(a.status_interval);
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => {
                tracing::info!(
                    applied = status.records_applied.load(Ordering::Relaxed),
                    skipped = status.records_skipped.load(Ordering::Relaxed),
                    lag = status.lag(),
                    broker_ok = status.broker_ok.load(Ordering::Relaxed),
                    keyspaces = engine.keyspace_ids().len(),
                    holder_blocks = engine.holder_blocks(),
                    "progress"
                );
            }
        }
    }
    tracing::info!("stopping");
    drop(replica.stop());
    Ok(())
}

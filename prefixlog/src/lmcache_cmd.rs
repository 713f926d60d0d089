//! `prefixlog lmcache-bridge`: LMCache's Kafka cache-event stream → the log.

use prefixlog::kafka_args::KafkaArgs;
use prefixlog_bridge::lmcache::{self, run::Source, Config, LmMetrics, Translator};
use prefixlog_ingest::{ClientRole, KafkaConnection, Publisher};
use prefixlog_query::admin::{AdminPort, AlwaysReady};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Reads the topic LMCache's coordinator sink writes (KafkaCacheEventSink: one CacheEventsRequest per
record, keyed by instance_id) from its start and publishes each instance's chunks as KV-event
records on its own worker: keyspace (the key's model_name, --chunk-size, scheme 1), tiers host
(L1 dram/devdax), disk (L1 gds) and external (L2). Gateways query with the prompt's token ids (and
the request's cache_salt). Only chunks whose blake3 chunk hash (LMCache's default hash_algorithm)
is reproduced from their token ids are indexed. docs/compat/lmcache.md has the mapping.
  prefixlog lmcache-bridge --brokers k:9092 --lmcache-topic lmcache.cache-events --chunk-size 256 \\
    --instance mp-server-0=5")]
pub struct Args {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// The topic LMCache's KafkaCacheEventSink publishes to.
    #[arg(long, env = "PREFIXLOG_LMCACHE_TOPIC")]
    pub lmcache_topic: String,
    /// Bootstrap servers of LMCache's Kafka (default: --brokers). -X properties apply to both.
    #[arg(long, env = "PREFIXLOG_LMCACHE_BROKERS")]
    pub lmcache_brokers: Option<String>,
    /// LMCache's chunk_size (tokens per chunk): the keyspaces' block size.
    #[arg(long, env = "PREFIXLOG_LMCACHE_CHUNK_SIZE", default_value_t = 256)]
    pub chunk_size: u32,
    /// The worker an instance's chunks are published under: ID=WORKER (repeatable). Others get
    /// a worker id derived from their instance id (xxh3, as `bridge --pod-name` derives one).
    #[arg(long = "instance", env = "PREFIXLOG_LMCACHE_INSTANCES", value_delimiter = ';', value_parser = parse_instance)]
    pub instances: Vec<(String, u64)>,
    /// Chunks tracked per instance; stores beyond are refused (table_full).
    #[arg(long, env = "PREFIXLOG_LMCACHE_MAX_CHUNKS", default_value_t = 1 << 20)]
    pub max_chunks: usize,
    /// Recent chunks per position tried as a chunk's parent.
    #[arg(long, env = "PREFIXLOG_LMCACHE_PARENT_CANDIDATES", default_value_t = 64)]
    pub parent_candidates: usize,
    /// Chunks held on L2 stored again after an instance restarts, at most.
    #[arg(long, env = "PREFIXLOG_LMCACHE_CARRY_OVER", default_value_t = 8192)]
    pub carry_over: usize,
    /// How long to wait at start for the LMCache topic to exist.
    #[arg(long, env = "PREFIXLOG_LMCACHE_WAIT_FOR_TOPIC", default_value = "5m", value_parser = humantime::parse_duration)]
    pub wait_for_topic: Duration,
    /// Admin HTTP address: Prometheus `/metrics` and `/healthz`.
    #[arg(long, env = "PREFIXLOG_LMCACHE_ADMIN_ADDR", default_value = "127.0.0.1:9153")]
    pub admin_addr: std::net::SocketAddr,
}

/// Parses `ID=WORKER`.
pub fn parse_instance(s: &str) -> Result<(String, u64), String> {
    let (id, w) = s.rsplit_once('=').ok_or_else(|| format!("expected ID=WORKER, got {s:?}"))?;
    let w = w.trim().parse::<u64>().map_err(|e| format!("worker {w:?}: {e}"))?;
    if id.is_empty() {
        return Err(format!("no instance id in {s:?}"));
    }
    Ok((id.to_string(), w))
}

/// The translator's configuration from the flags.
pub fn config(a: &Args) -> anyhow::Result<Config> {
    anyhow::ensure!(a.chunk_size > 0, "--chunk-size must be positive");
    let mut workers = BTreeMap::new();
    for (id, w) in &a.instances {
        if let Some(other) = workers.insert(id.clone(), *w).filter(|o| o != w) {
            anyhow::bail!("instance {id:?} is given two workers: {other} and {w}");
        }
    }
    let mut cfg = Config::new(a.chunk_size);
    cfg.max_chunks = a.max_chunks;
    cfg.parent_candidates = a.parent_candidates.max(1);
    cfg.carry_over = a.carry_over;
    cfg.workers = workers;
    Ok(cfg)
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let cfg = config(&a)?;
    let brokers = a.kafka.require_brokers("lmcache-bridge")?;
    let spec = a.kafka.spec(&brokers)?;
    let publisher = Publisher::connect(&spec).await?;
    let lm_brokers = a.lmcache_brokers.clone().unwrap_or(brokers);
    let conn = KafkaConnection::new(lm_brokers).with_properties(spec.kafka.properties.clone());
    let source = Source {
        config: conn.client_config(ClientRole::Probe),
        topic: a.lmcache_topic.clone(),
        wait_for_topic: a.wait_for_topic,
    };
    let metrics = LmMetrics::default();
    let registry = prometheus::Registry::new();
    metrics.register(&registry)?;
    prefixlog_query::metrics::register_build_info(&registry)?;
    let _ = registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()));
    let admin = AdminPort::bind(a.admin_addr, registry, Arc::new(AlwaysReady("lmcache bridge running")))
        .await
        .map_err(|e| anyhow::anyhow!("binding --admin-addr {}: {e}", a.admin_addr))?;
    tracing::info!(addr = %admin.addr(), "lmcache bridge admin port: /metrics, /healthz");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        crate::bridge_cmd::shutdown_signal().await;
        tracing::info!("lmcache bridge: shutting down");
        let _ = stop_tx.send(true);
    });
    tracing::info!(topic = %a.lmcache_topic, chunk_size = a.chunk_size, "lmcache bridge: starting");
    let t = lmcache::run::run(source, Translator::new(cfg, metrics), publisher, stop_rx).await?;
    let m = t.metrics();
    tracing::info!(
        admitted = LmMetrics::get(&m.batches, "admitted"),
        stored = LmMetrics::get(&m.chunks, "stored"),
        removed = LmMetrics::get(&m.chunks, "removed"),
        "lmcache bridge: stopped"
    );
    drop(admin);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: Args,
    }

    #[test]
    fn instances_name_workers_once() {
        let c =
            Cli::try_parse_from(["x", "--lmcache-topic", "t", "--instance", "a=5", "--instance", "b=c=6"])
                .unwrap();
        let cfg = config(&c.a).unwrap();
        assert_eq!(cfg.workers, BTreeMap::from([("a".into(), 5), ("b=c".into(), 6)]));
        assert_eq!(cfg.chunk_size, 256);
        let twice =
            Cli::try_parse_from(["x", "--lmcache-topic", "t", "--instance", "a=5", "--instance", "a=6"])
                .unwrap();
        assert!(config(&twice.a).unwrap_err().to_string().contains("two workers"));
        for bad in ["a", "=5", "a=x"] {
            assert!(parse_instance(bad).is_err(), "{bad}");
        }
        let zero = Cli::try_parse_from(["x", "--lmcache-topic", "t", "--chunk-size", "0"]).unwrap();
        assert!(config(&zero.a).is_err());
    }
}

//! `prefixlog bridge`: vLLM / SGLang KV events over ZeroMQ → the log.

use crate::kafka_args::KafkaArgs;
use prefixlog_engine::{scheme, KeyspaceId};
use prefixlog_ingest::bridge::{self, BridgeOptions, EngineSpec};
use prefixlog_ingest::Publisher;
use std::time::Duration;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
One engine: --endpoint tcp://HOST:5557 [--replay-endpoint tcp://HOST:5558] --worker-id W [--dp-rank R].
Several engines in one process: repeat --engine instead (or in addition), each a comma-separated
list of key=value: endpoint=URL (required), worker=ID (required), replay=URL, dp=RANK, topic=PREFIX.
  prefixlog bridge --model llama --block-size 16 --brokers k:9092 \\
    --engine endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5600,worker=5 \\
    --engine endpoint=tcp://10.0.0.5:5558,replay=tcp://10.0.0.5:5601,worker=5,dp=1
vLLM: --kv-events-config '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5600\"}'
(data-parallel rank r uses both ports + r, so keep them apart). SGLang: --kv-events-config with
the same keys. Every engine of one bridge shares the keyspace (--model, --block-size,
--hash-scheme). --brokers is required (the bridge never starts an embedded broker).")]
pub struct Args {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// The engine's ZeroMQ PUB endpoint.
    #[arg(long, env = "PREFIXLOG_BRIDGE_ENDPOINT", requires = "worker_id")]
    pub endpoint: Option<String>,
    /// The engine's replay ROUTER endpoint (gaps are then recovered instead of published).
    #[arg(long, env = "PREFIXLOG_BRIDGE_REPLAY_ENDPOINT", requires = "endpoint")]
    pub replay_endpoint: Option<String>,
    /// The worker id the engine's events are published under.
    #[arg(long, env = "PREFIXLOG_BRIDGE_WORKER_ID", requires = "endpoint")]
    pub worker_id: Option<u64>,
    /// Data-parallel rank (default: the rank the engine stamps on its batches, else 0).
    #[arg(long, env = "PREFIXLOG_BRIDGE_DP_RANK", requires = "endpoint")]
    pub dp_rank: Option<u32>,
    /// ZeroMQ subscription prefix (the engine's `topic`; default: everything).
    #[arg(long, env = "PREFIXLOG_BRIDGE_ZMQ_TOPIC", default_value = "")]
    pub zmq_topic: String,
    /// More engines: endpoint=URL,worker=ID[,replay=URL][,dp=RANK][,topic=PREFIX] (repeatable).
    #[arg(long = "engine", env = "PREFIXLOG_BRIDGE_ENGINE", value_parser = parse_engine)]
    pub engines: Vec<EngineSpec>,
    /// Model name of the keyspace.
    #[arg(long, env = "PREFIXLOG_BRIDGE_MODEL")]
    pub model: String,
    /// Tokens per block; stored events whose token count does not tile it are refused.
    #[arg(long, env = "PREFIXLOG_BRIDGE_BLOCK_SIZE")]
    pub block_size: u32,
    /// Canonical hash scheme of the keyspace.
    #[arg(long, env = "PREFIXLOG_BRIDGE_HASH_SCHEME", default_value_t = scheme::SCHEME_XXH3_CHAINED)]
    pub hash_scheme: u32,
    /// Publish worker-removed for every worker on a clean shutdown (Ctrl-C / SIGTERM).
    #[arg(long, env = "PREFIXLOG_BRIDGE_REMOVE_ON_EXIT")]
    pub remove_on_exit: bool,
    /// Re-subscribe to an engine silent for this long (finds a restarted engine again).
    #[arg(long, env = "PREFIXLOG_BRIDGE_IDLE_RECONNECT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub idle_reconnect: Duration,
    /// Give up a replay request after this long and publish the gap.
    #[arg(long, env = "PREFIXLOG_BRIDGE_REPLAY_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub replay_timeout: Duration,
    /// Log each engine's counters this often (0s: never).
    #[arg(long, env = "PREFIXLOG_BRIDGE_METRICS_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    pub metrics_interval: Duration,
    /// Admin HTTP address: Prometheus `/metrics` (the bridge counters) and `/healthz`.
    #[arg(long, env = "PREFIXLOG_BRIDGE_ADMIN_ADDR", default_value = "127.0.0.1:9152")]
    pub admin_addr: std::net::SocketAddr,
}

/// Parses `endpoint=URL,worker=ID[,replay=URL][,dp=RANK][,topic=PREFIX]`.
pub fn parse_engine(s: &str) -> Result<EngineSpec, String> {
    let (mut endpoint, mut worker, mut replay, mut dp, mut topic) = (None, None, None, None, String::new());
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| format!("expected key=value, got {part:?}"))?;
        match k.trim() {
            "endpoint" => endpoint = Some(v.to_string()),
            "replay" => replay = Some(v.to_string()),
            "worker" => worker = Some(v.parse::<u64>().map_err(|e| format!("worker {v:?}: {e}"))?),
            "dp" => dp = Some(v.parse::<u32>().map_err(|e| format!("dp {v:?}: {e}"))?),
            "topic" => topic = v.to_string(),
            other => return Err(format!("unknown key {other:?} (endpoint, worker, replay, dp, topic)")),
        }
    }
    Ok(EngineSpec {
        endpoint: endpoint.ok_or("endpoint=URL is required")?,
        replay_endpoint: replay,
        worker: worker.ok_or("worker=ID is required")?,
        dp_rank: dp,
        topic,
    })
}

/// Every engine the arguments name.
pub fn engines(a: &Args) -> anyhow::Result<Vec<EngineSpec>> {
    let mut out = Vec::new();
    if let (Some(endpoint), Some(worker)) = (&a.endpoint, a.worker_id) {
        out.push(EngineSpec {
            endpoint: endpoint.clone(),
            replay_endpoint: a.replay_endpoint.clone(),
            worker,
            dp_rank: a.dp_rank,
            topic: a.zmq_topic.clone(),
        });
    }
    out.extend(a.engines.iter().cloned());
    anyhow::ensure!(!out.is_empty(), "no engine: give --endpoint and --worker-id, or --engine");
    // Before connecting to anything (`bridge::run` checks again, for library callers).
    bridge::engines::check_engines(&out)?;
    Ok(out)
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let engines = engines(&a)?;
    anyhow::ensure!(scheme::is_known(a.hash_scheme), "unknown hash scheme {}", a.hash_scheme);
    anyhow::ensure!(a.block_size > 0, "--block-size must be positive");
    let brokers = a.kafka.require_brokers("bridge")?;
    let publisher = Publisher::connect(&a.kafka.spec(&brokers)?).await?;
    let mut opts = BridgeOptions::new(KeyspaceId::new(a.model.clone(), a.block_size, a.hash_scheme));
    opts.idle_reconnect = a.idle_reconnect;
    opts.replay_timeout = a.replay_timeout;
    opts.log_interval = a.metrics_interval;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("bridge: shutting down");
        let _ = stop_tx.send(true);
    });
    let listener = tokio::net::TcpListener::bind(a.admin_addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding --admin-addr {}: {e}", a.admin_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "bridge admin port: /metrics, /healthz");
    let registry = prometheus::Registry::new();
    let exported = std::sync::Arc::new(bridge::metrics::BridgeCollector::default());
    exported.register(&registry)?;
    let pc = prometheus::process_collector::ProcessCollector::for_self();
    let _ = registry.register(Box::new(pc));
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let r = registry.clone();
                async move {
                    ([("content-type", "text/plain; version=0.0.4")], prefixlog_query::metrics::render(&r))
                }
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    tracing::info!(engines = engines.len(), keyspace = %opts.keyspace, epoch = opts.start_epoch, "bridge: starting");
    let metrics = bridge::run(engines, opts, publisher, a.remove_on_exit, stop_rx, &exported).await?;
    for (spec, m) in metrics {
        let nonzero: Vec<String> =
            m.snapshot().into_iter().filter(|(_, v)| *v > 0).map(|(n, v)| format!("{n}={v}")).collect();
        tracing::info!(worker = spec.worker, endpoint = %spec.endpoint, "bridge final counters: {}", nonzero.join(" "));
    }
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
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
    fn parses_one_and_several_engines() {
        let c = Cli::try_parse_from([
            "x",
            "--endpoint",
            "tcp://h:5557",
            "--replay-endpoint",
            "tcp://h:5558",
            "--worker-id",
            "7",
            "--model",
            "m",
            "--block-size",
            "16",
            "--engine",
            "endpoint=tcp://h:5559,worker=8,dp=1,replay=tcp://h:5560,topic=kv",
        ])
        .unwrap();
        let e = engines(&c.a).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(
            e[0],
            EngineSpec {
                endpoint: "tcp://h:5557".into(),
                replay_endpoint: Some("tcp://h:5558".into()),
                worker: 7,
                dp_rank: None,
                topic: String::new()
            }
        );
        assert_eq!(
            e[1],
            EngineSpec {
                endpoint: "tcp://h:5559".into(),
                replay_endpoint: Some("tcp://h:5560".into()),
                worker: 8,
                dp_rank: Some(1),
                topic: "kv".into()
            }
        );
        assert!(parse_engine("worker=1").is_err());
        assert!(parse_engine("endpoint=tcp://h:1").is_err());
        assert!(parse_engine("endpoint=tcp://h:1,worker=1,color=red").is_err());
        assert!(Cli::try_parse_from(["x", "--endpoint", "tcp://h:1", "--model", "m", "--block-size", "4"])
            .is_err());
        let none = Cli::try_parse_from(["x", "--model", "m", "--block-size", "4"]).unwrap();
        assert!(engines(&none.a).is_err());
    }

    #[test]
    fn one_engine_stream_named_twice_is_refused_before_anything_connects() {
        let c = Cli::try_parse_from([
            "bridge",
            "--model",
            "m",
            "--block-size",
            "16",
            "--endpoint",
            "tcp://h:5557",
            "--worker-id",
            "7",
            "--engine",
            "endpoint=tcp://h:5557,worker=8",
        ])
        .unwrap();
        let e = engines(&c.a).unwrap_err().to_string();
        assert!(e.contains("tcp://h:5557 is given twice"), "{e}");
    }
}

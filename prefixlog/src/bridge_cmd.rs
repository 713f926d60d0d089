//! `prefixlog bridge`: vLLM / SGLang KV events over ZeroMQ → the log.

use prefixlog::kafka_args::KafkaArgs;
use prefixlog_bridge::{self as bridge, BridgeOptions, EngineSpec};
use prefixlog_engine::{scheme, KeyspaceId};
use prefixlog_ingest::Publisher;
use prefixlog_query::admin::{AdminPort, AlwaysReady};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
One engine: --endpoint tcp://HOST:5557 [--replay-endpoint tcp://HOST:5558] --worker-id W [--dp-rank R].
Several engines in one process: repeat --engine instead (or in addition), each a comma-separated
list of key=value: endpoint=URL (required), worker=ID, replay=URL, dp=RANK, topic=PREFIX, url=URL.
  prefixlog bridge --model llama --block-size 16 --brokers k:9092 \\
    --engine endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5600,worker=5,url=http://10.0.0.5:8000 \\
    --engine endpoint=tcp://10.0.0.5:5558,replay=tcp://10.0.0.5:5601,worker=5,dp=1
Naming the worker for gateways: --serving-url is where requests for this worker go (published as
its `serving_url` metadata, returned by ListWorkers; an engine's url= overrides it); --pod-name
is published as `pod`, and without --worker-id / worker= the worker id is derived from it (one
pod, one worker). In Kubernetes, a sidecar next to the engine sets both from the downward API:
  env: PREFIXLOG_BRIDGE_POD_NAME from fieldRef metadata.name, POD_IP from status.podIP,
       PREFIXLOG_BRIDGE_SERVING_URL=http://$(POD_IP):8000
The engine's ZeroMQ endpoints are published as `kv_events_endpoint` (not an address for requests).
vLLM: --kv-events-config '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5600\"}'
(data-parallel rank r uses both ports + r, so keep them apart). SGLang: --kv-events-config with
the same keys. Every engine of one bridge shares the keyspace (--model, --block-size,
--hash-scheme). --brokers is required (the bridge never starts an embedded broker).")]
pub struct Args {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// The engine's ZeroMQ PUB endpoint.
    #[arg(long, env = "PREFIXLOG_BRIDGE_ENDPOINT")]
    pub endpoint: Option<String>,
    /// The engine's replay ROUTER endpoint (gaps are then recovered instead of published).
    #[arg(long, env = "PREFIXLOG_BRIDGE_REPLAY_ENDPOINT", requires = "endpoint")]
    pub replay_endpoint: Option<String>,
    /// The worker id the engine's events are published under (default with --pod-name: derived
    /// from the pod name).
    #[arg(long, env = "PREFIXLOG_BRIDGE_WORKER_ID", requires = "endpoint")]
    pub worker_id: Option<u64>,
    /// The worker's serving URL (OpenAI-compatible HTTP base, e.g. http://10.0.0.5:8000):
    /// published as its `serving_url` metadata, where gateways send its requests.
    #[arg(long, env = "PREFIXLOG_BRIDGE_SERVING_URL", value_parser = parse_serving_url)]
    pub serving_url: Option<String>,
    /// The pod (or host) the engine runs in: published as `pod` metadata; the worker id is
    /// derived from it when none is given. Kubernetes: from the downward API (metadata.name).
    #[arg(long, env = "PREFIXLOG_BRIDGE_POD_NAME")]
    pub pod_name: Option<String>,
    /// Data-parallel rank (default: the rank the engine stamps on its batches, else 0).
    #[arg(long, env = "PREFIXLOG_BRIDGE_DP_RANK", requires = "endpoint")]
    pub dp_rank: Option<u32>,
    /// ZeroMQ subscription prefix (the engine's `topic`; default: everything).
    #[arg(long, env = "PREFIXLOG_BRIDGE_ZMQ_TOPIC", default_value = "")]
    pub zmq_topic: String,
    /// More engines: endpoint=URL[,worker=ID][,replay=URL][,dp=RANK][,topic=PREFIX][,url=URL]
    /// (repeatable).
    #[arg(long = "engine", env = "PREFIXLOG_BRIDGE_ENGINE", value_parser = parse_engine)]
    pub engines: Vec<EngineArg>,
    /// Model name of the keyspace.
    #[arg(long, env = "PREFIXLOG_BRIDGE_MODEL")]
    pub model: String,
    /// Tokens per block; stored events whose token count does not tile it are refused.
    #[arg(long, env = "PREFIXLOG_BRIDGE_BLOCK_SIZE")]
    pub block_size: u32,
    /// Hash scheme of the keyspace: 1, prefixlog's chained XXH3 (the default); 2, Dynamo's
    /// position-free block hash (what `python -m dynamo.indexer` and the HTTP facade's
    /// `/query_by_hash` use; stores with multimodal or cache-salt keys are then refused,
    /// counted as `scheme_keys`).
    #[arg(long, env = "PREFIXLOG_BRIDGE_HASH_SCHEME", default_value_t = scheme::SCHEME_XXH3_CHAINED)]
    pub hash_scheme: u32,
    /// Publish worker-removed for every worker on a clean shutdown (Ctrl-C / SIGTERM).
    #[arg(long, env = "PREFIXLOG_BRIDGE_REMOVE_ON_EXIT")]
    pub remove_on_exit: bool,
    /// Re-subscribe to an engine that sent no message for this long (a fallback: a closed
    /// connection or unanswered heartbeats find a lost engine first).
    #[arg(long, env = "PREFIXLOG_BRIDGE_IDLE_RECONNECT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub idle_reconnect: Duration,
    /// Send a ZMTP heartbeat (PING) to an engine after this long without traffic (0s: never).
    #[arg(long, env = "PREFIXLOG_BRIDGE_HEARTBEAT_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub heartbeat_interval: Duration,
    /// Drop and re-establish a connection with no traffic this long after a heartbeat; also
    /// bounds connecting, the handshake and each write.
    #[arg(long, env = "PREFIXLOG_BRIDGE_HEARTBEAT_TIMEOUT", default_value = "15s", value_parser = humantime::parse_duration)]
    pub heartbeat_timeout: Duration,
    /// Ask an engine's replay socket for what followed its last message after this long without
    /// one (0s: never): a publisher whose send queue was full drops its newest messages, and
    /// nothing else tells until the engine publishes again.
    #[arg(long, env = "PREFIXLOG_BRIDGE_TAIL_PROBE", default_value = "2s", value_parser = humantime::parse_duration)]
    pub tail_probe: Duration,
    /// Give up a replay request after this long; the gap is then closed by clearing the
    /// worker's state through the log (a new epoch) and starting over.
    #[arg(long, env = "PREFIXLOG_BRIDGE_REPLAY_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub replay_timeout: Duration,
    /// Most bytes one replay answer may bring (every message's frames together); past it the
    /// replay fails and the stream starts over. vLLM buffers 10,000 batches by default.
    #[arg(long, env = "PREFIXLOG_BRIDGE_MAX_REPLAY_BYTES", default_value_t = 256 << 20)]
    pub max_replay_bytes: usize,
    /// Most bytes of one ZeroMQ frame an engine may declare (a message: this plus 64 KiB for its
    /// other frames). Over it the connection is dropped before anything is reserved, counted
    /// (messages_skipped{reason="oversized"}) and re-established; the lost message is a sequence
    /// gap. The default is some 30 times the largest batch a vLLM or SGLang step publishes.
    #[arg(long, env = "PREFIXLOG_BRIDGE_MAX_FRAME_BYTES", default_value_t = bridge::DEFAULT_MAX_FRAME_BYTES, value_parser = parse_frame_cap)]
    pub max_frame_bytes: usize,
    /// Log each engine's counters this often (0s: never).
    #[arg(long, env = "PREFIXLOG_BRIDGE_METRICS_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    pub metrics_interval: Duration,
    /// Admin HTTP address: Prometheus `/metrics` (the bridge counters) and `/healthz`.
    #[arg(long, env = "PREFIXLOG_BRIDGE_ADMIN_ADDR", default_value = "127.0.0.1:9152")]
    pub admin_addr: std::net::SocketAddr,
}

/// One `--engine`: the stream, and what the worker is called where the flag says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineArg {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    /// None: the bridge's `--pod-name` names the worker.
    pub worker: Option<u64>,
    pub dp_rank: Option<u32>,
    pub topic: String,
    /// Overrides `--serving-url` for this engine's worker.
    pub serving_url: Option<String>,
}

/// A serving URL must be an http(s) base URL with a host: it is what gateways connect to.
pub fn parse_serving_url(s: &str) -> Result<String, String> {
    let s = s.trim().trim_end_matches('/');
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
        .ok_or_else(|| format!("serving URL {s:?}: expected http://HOST:PORT or https://HOST:PORT"))?;
    if rest.is_empty() || rest.starts_with(':') || rest.starts_with('/') || rest.contains("$(") {
        return Err(format!("serving URL {s:?} has no host (an unexpanded $(VAR)?)"));
    }
    Ok(s.to_string())
}

/// A frame cap: at least 1 KiB (a sequence frame and a small batch), at most 1 GiB.
pub fn parse_frame_cap(s: &str) -> Result<usize, String> {
    let n: usize = s.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !(1 << 10..=1 << 30).contains(&n) {
        return Err(format!("{n}: expected 1024 to 1073741824 bytes"));
    }
    Ok(n)
}

/// Parses `endpoint=URL[,worker=ID][,replay=URL][,dp=RANK][,topic=PREFIX][,url=URL]`.
pub fn parse_engine(s: &str) -> Result<EngineArg, String> {
    let mut e = EngineArg {
        endpoint: String::new(),
        replay_endpoint: None,
        worker: None,
        dp_rank: None,
        topic: String::new(),
        serving_url: None,
    };
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| format!("expected key=value, got {part:?}"))?;
        match k.trim() {
            "endpoint" => e.endpoint = v.to_string(),
            "replay" => e.replay_endpoint = Some(v.to_string()),
            "worker" => e.worker = Some(v.parse::<u64>().map_err(|err| format!("worker {v:?}: {err}"))?),
            "dp" => e.dp_rank = Some(v.parse::<u32>().map_err(|err| format!("dp {v:?}: {err}"))?),
            "topic" => e.topic = v.to_string(),
            "url" => e.serving_url = Some(parse_serving_url(v)?),
            other => return Err(format!("unknown key {other:?} (endpoint, worker, replay, dp, topic, url)")),
        }
    }
    if e.endpoint.is_empty() {
        return Err("endpoint=URL is required".into());
    }
    Ok(e)
}

/// Every engine the arguments name, and each worker's serving URL.
pub fn engines(a: &Args) -> anyhow::Result<(Vec<EngineSpec>, BTreeMap<u64, String>)> {
    let pod_worker = a.pod_name.as_deref().map(bridge::worker_id_of_pod);
    let worker_of = |given: Option<u64>, endpoint: &str| {
        given.or(pod_worker).ok_or_else(|| {
            anyhow::anyhow!(
                "engine {endpoint}: no worker id: give --worker-id (worker= in --engine) or --pod-name"
            )
        })
    };
    let mut named: Vec<(EngineSpec, Option<String>)> = Vec::new();
    if let Some(endpoint) = &a.endpoint {
        let spec = EngineSpec {
            endpoint: endpoint.clone(),
            replay_endpoint: a.replay_endpoint.clone(),
            worker: worker_of(a.worker_id, endpoint)?,
            dp_rank: a.dp_rank,
            topic: a.zmq_topic.clone(),
        };
        named.push((spec, a.serving_url.clone()));
    }
    for e in &a.engines {
        let spec = EngineSpec {
            endpoint: e.endpoint.clone(),
            replay_endpoint: e.replay_endpoint.clone(),
            worker: worker_of(e.worker, &e.endpoint)?,
            dp_rank: e.dp_rank,
            topic: e.topic.clone(),
        };
        named.push((spec, e.serving_url.clone().or_else(|| a.serving_url.clone())));
    }
    anyhow::ensure!(
        !named.is_empty(),
        "no engine: give --endpoint (with --worker-id or --pod-name), or --engine"
    );
    let mut urls: BTreeMap<u64, String> = BTreeMap::new();
    for (spec, url) in &named {
        let Some(url) = url else { continue };
        if let Some(other) = urls.insert(spec.worker, url.clone()).filter(|o| o != url) {
            anyhow::bail!("worker {} has two serving URLs: {other} and {url}", spec.worker);
        }
    }
    let out: Vec<EngineSpec> = named.into_iter().map(|(spec, _)| spec).collect();
    // Before connecting to anything (`bridge::run` checks again, for library callers).
    bridge::engines::check_engines(&out)?;
    Ok((out, urls))
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let (engines, serving_urls) = engines(&a)?;
    anyhow::ensure!(
        bridge::scheme::is_supported(a.hash_scheme),
        "hash scheme {} is not one the bridge hashes stored blocks in (1: prefixlog's chain, 2: Dynamo's block hash)",
        a.hash_scheme
    );
    anyhow::ensure!(a.block_size > 0, "--block-size must be positive");
    anyhow::ensure!(!a.heartbeat_timeout.is_zero(), "--heartbeat-timeout must be positive");
    let brokers = a.kafka.require_brokers("bridge")?;
    let publisher = Publisher::connect(&a.kafka.spec(&brokers)?).await?;
    let mut opts = BridgeOptions::new(KeyspaceId::new(a.model.clone(), a.block_size, a.hash_scheme));
    opts.idle_reconnect = a.idle_reconnect;
    opts.replay_timeout = a.replay_timeout;
    opts.tail_probe = a.tail_probe;
    opts.max_replay_bytes = a.max_replay_bytes;
    opts.max_frame_bytes = a.max_frame_bytes;
    opts.heartbeat_interval = a.heartbeat_interval;
    opts.heartbeat_timeout = a.heartbeat_timeout;
    opts.log_interval = a.metrics_interval;
    opts.serving_urls = serving_urls;
    if let Some(pod) = &a.pod_name {
        opts.worker_metadata.insert(bridge::META_POD.into(), pod.clone());
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("bridge: shutting down");
        let _ = stop_tx.send(true);
    });
    let registry = prometheus::Registry::new();
    let exported = Arc::new(bridge::metrics::BridgeCollector::default());
    exported.register(&registry)?;
    prefixlog_query::metrics::register_build_info(&registry)?;
    let pc = prometheus::process_collector::ProcessCollector::for_self();
    let _ = registry.register(Box::new(pc));
    let admin = AdminPort::bind(a.admin_addr, registry, Arc::new(AlwaysReady("bridge running")))
        .await
        .map_err(|e| anyhow::anyhow!("binding --admin-addr {}: {e}", a.admin_addr))?;
    tracing::info!(addr = %admin.addr(), "bridge admin port: /metrics, /healthz, /readyz");
    tracing::info!(engines = engines.len(), keyspace = %opts.keyspace, epoch = opts.start_epoch, "bridge: starting");
    let metrics = bridge::run(engines, opts, publisher, a.remove_on_exit, stop_rx, &exported).await?;
    for (spec, m) in metrics {
        let nonzero: Vec<String> =
            m.snapshot().into_iter().filter(|(_, v)| *v > 0).map(|(n, v)| format!("{n}={v}")).collect();
        tracing::info!(worker = spec.worker, endpoint = %spec.endpoint, "bridge final counters: {}", nonzero.join(" "));
    }
    drop(admin);
    Ok(())
}

pub(crate) async fn shutdown_signal() {
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
        let (e, urls) = engines(&c.a).unwrap();
        assert_eq!(e.len(), 2);
        assert!(urls.is_empty());
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
        assert!(parse_engine("endpoint=tcp://h:1,url=tcp://h:2").is_err());
        assert!(parse_engine("endpoint=tcp://h:1,worker=1,color=red").is_err());
        let no_worker =
            Cli::try_parse_from(["x", "--endpoint", "tcp://h:1", "--model", "m", "--block-size", "4"])
                .unwrap();
        assert!(engines(&no_worker.a).is_err());
        let none = Cli::try_parse_from(["x", "--model", "m", "--block-size", "4"]).unwrap();
        assert!(engines(&none.a).is_err());
    }

    #[test]
    fn the_transport_bounds_parse_with_their_defaults() {
        let base = ["x", "--endpoint", "tcp://h:1", "--worker-id", "1", "--model", "m", "--block-size", "4"];
        let c = Cli::try_parse_from(base).unwrap();
        assert_eq!(c.a.max_frame_bytes, 64 << 20);
        assert_eq!(
            (c.a.heartbeat_interval, c.a.heartbeat_timeout),
            (Duration::from_secs(5), Duration::from_secs(15))
        );
        let c = Cli::try_parse_from(base.iter().copied().chain([
            "--max-frame-bytes",
            "1048576",
            "--heartbeat-interval",
            "0s",
            "--heartbeat-timeout",
            "2s",
        ]))
        .unwrap();
        assert_eq!((c.a.max_frame_bytes, c.a.heartbeat_interval.is_zero()), (1 << 20, true));
        for bad in ["1023", "1073741825", "-1", "64MiB"] {
            assert!(
                Cli::try_parse_from(base.iter().copied().chain(["--max-frame-bytes", bad])).is_err(),
                "{bad}"
            );
        }
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

    #[test]
    fn the_worker_is_named_by_its_serving_url_and_pod() {
        let base = ["bridge", "--model", "m", "--block-size", "16", "--endpoint", "tcp://h:5557"];
        // No worker id and no pod: nothing names the worker.
        let c = Cli::try_parse_from(base).unwrap();
        assert!(engines(&c.a).unwrap_err().to_string().contains("no worker id"));
        let c = Cli::try_parse_from(base.iter().copied().chain([
            "--pod-name",
            "vllm-7f9c-x2",
            "--serving-url",
            "http://10.0.0.5:8000/",
        ]))
        .unwrap();
        let (e, urls) = engines(&c.a).unwrap();
        let w = bridge::worker_id_of_pod("vllm-7f9c-x2");
        assert_eq!(e[0].worker, w);
        assert!(w < 1 << 63);
        assert_eq!(urls, BTreeMap::from([(w, "http://10.0.0.5:8000".to_string())]));
        // An explicit id wins over the pod's; an engine's url= over --serving-url.
        let c = Cli::try_parse_from(base.iter().copied().chain([
            "--worker-id",
            "3",
            "--pod-name",
            "p",
            "--serving-url",
            "http://a:1",
            "--engine",
            "endpoint=tcp://h:5558,url=http://b:2",
        ]))
        .unwrap();
        let (e, urls) = engines(&c.a).unwrap();
        assert_eq!((e[0].worker, e[1].worker), (3, bridge::worker_id_of_pod("p")));
        assert_eq!(urls[&3], "http://a:1");
        assert_eq!(urls[&e[1].worker], "http://b:2");
        // One worker, two URLs: refused.
        let c = Cli::try_parse_from(base.iter().copied().chain([
            "--worker-id",
            "3",
            "--serving-url",
            "http://a:1",
            "--engine",
            "endpoint=tcp://h:5558,worker=3,dp=1,url=http://b:2",
        ]))
        .unwrap();
        assert!(engines(&c.a).unwrap_err().to_string().contains("two serving URLs"));
        for bad in ["10.0.0.5:8000", "http://", "http://:8000", "http://$(POD_IP):8000"] {
            assert!(parse_serving_url(bad).is_err(), "{bad}");
        }
    }
}

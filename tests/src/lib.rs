//! Shared fixtures for prefixlog's cross-crate integration tests.
//!
//! [`kafka_backends`] yields the Kafka backends of this run, in order:
//! 1. `testcontainers`: tansu 0.6.0 (an independent Kafka-compatible broker) in a container
//!    started from the local image `local/tansu:0.6.0` (`scripts/build-images.sh tansu`; no
//!    registry needed) with host networking on a free loopback port and SQLite storage inside
//!    the container; removed when the backend is dropped;
//! 2. `external`: a broker named by `PREFIXLOG_TEST_KAFKA=host:port` (scripts/with-tansu.sh);
//! 3. `embedded`: the in-process librdkafka mock cluster.
//!
//! `PREFIXLOG_TEST_BACKENDS` (comma-separated names, e.g. `testcontainers` or
//! `embedded,external`) says which run. A backend named there that cannot start fails the test:
//! nothing is silently skipped. Unset, every backend that is available runs and the others are
//! reported as `NOT RUN (reason)` — e.g. testcontainers without a Docker engine, which fails
//! within milliseconds. Tests run their body once per backend and print which ran.
//!
//! Module map: [`http`] (a GET against an admin port, metric samples), [`replicas`] (replicas
//! started the one way), [`raw_produce`] (hand-built record batches: transaction markers),
//! [`zmtp_pub`] (a stand-in engine publisher in Rust).
//! [`secured::SecuredKafka`] is a broker as production runs it (SASL/SCRAM over TLS, tansu behind
//! a TLS terminator) for the tests of each component's secured connection.

pub mod flood;
pub mod http;
pub mod raw_produce;
pub mod replicas;
pub mod secured;
pub mod zmtp_pub;

use prefixlog_ingest::EmbeddedKafka;
use rdkafka::config::ClientConfig;
use std::time::{Duration, Instant};
use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

/// The broker image of the testcontainers backend (built locally by scripts/build-images.sh).
pub const TANSU_IMAGE: (&str, &str) = ("local/tansu", "0.6.0");

/// How long a backend may take to start and answer metadata (a loaded 2-core CI machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A reachable Kafka plus whatever keeps it alive.
pub struct KafkaBackend {
    pub name: &'static str,
    pub brokers: String,
    embedded: Option<EmbeddedKafka>,
    _container: Option<ContainerAsync<GenericImage>>,
}

impl KafkaBackend {
    /// The embedded broker, when this is that backend (it can be taken down and brought back).
    pub fn embedded(&self) -> Option<&EmbeddedKafka> {
        self.embedded.as_ref()
    }

    /// Creates a topic (the mock cluster has no admin API; real brokers use it).
    pub async fn create_topic(&self, topic: &str, partitions: u32) -> anyhow::Result<()> {
        if let Some(e) = &self.embedded {
            e.create_topic(topic, partitions)?;
            return Ok(());
        }
        let conn = prefixlog_ingest::KafkaConnection::new(&self.brokers);
        Ok(prefixlog_ingest::create_topic(&conn, topic, partitions, &[]).await?)
    }
}

const BACKENDS: [&str; 3] = ["testcontainers", "external", "embedded"];

/// The backends `PREFIXLOG_TEST_BACKENDS` names (`None`: unset, every available one).
fn selected() -> Option<Vec<String>> {
    let v = std::env::var("PREFIXLOG_TEST_BACKENDS").ok()?;
    let names: Vec<String> = v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    for n in &names {
        assert!(
            BACKENDS.contains(&n.as_str()),
            "PREFIXLOG_TEST_BACKENDS={v}: unknown backend {n} (known: {BACKENDS:?})"
        );
    }
    assert!(!names.is_empty(), "PREFIXLOG_TEST_BACKENDS is set but names no backend");
    Some(names)
}

/// Every selected backend; logs (to stderr) which ran and why others did not. Panics when a
/// backend `PREFIXLOG_TEST_BACKENDS` names cannot start.
pub async fn kafka_backends() -> Vec<KafkaBackend> {
    let sel = selected();
    let wanted = |name: &str| sel.as_ref().is_none_or(|s| s.iter().any(|n| n == name));
    let required = |name: &str| sel.as_ref().is_some_and(|s| s.iter().any(|n| n == name));
    let not_run = |name: &str, why: String| {
        if required(name) {
            panic!("[kafka backend] {name}: required by PREFIXLOG_TEST_BACKENDS but could not start: {why}");
        }
        eprintln!("[kafka backend] {name}: NOT RUN ({why})");
    };
    let mut out = Vec::new();
    if wanted("testcontainers") {
        match start_tansu_container().await {
            Ok(b) => out.push(b),
            Err(e) => not_run("testcontainers", format!("{e:#}")),
        }
    } else {
        not_run("testcontainers", "not selected by PREFIXLOG_TEST_BACKENDS".into());
    }
    if !wanted("external") {
        not_run("external", "not selected by PREFIXLOG_TEST_BACKENDS".into());
    } else if let Ok(b) = std::env::var("PREFIXLOG_TEST_KAFKA") {
        out.push(KafkaBackend { name: "external", brokers: b, embedded: None, _container: None });
    } else {
        not_run("external", "PREFIXLOG_TEST_KAFKA not set".into());
    }
    if wanted("embedded") {
        let e = EmbeddedKafka::start("prefixlog.fixture", 1).expect("embedded mock cluster starts");
        out.push(KafkaBackend {
            name: "embedded",
            brokers: e.bootstrap_servers(),
            embedded: Some(e),
            _container: None,
        });
    } else {
        not_run("embedded", "not selected by PREFIXLOG_TEST_BACKENDS".into());
    }
    out
}

/// Starts tansu from [`TANSU_IMAGE`] with host networking on a free loopback port and waits
/// until it answers metadata requests. The container is removed when the returned backend is
/// dropped (also when a test panics).
async fn start_tansu_container() -> anyhow::Result<KafkaBackend> {
    let port = listen_port();
    let url = format!("tcp://127.0.0.1:{port}");
    let (name, tag) = TANSU_IMAGE;
    let started = Instant::now();
    let container = GenericImage::new(name, tag)
        .with_wait_for(WaitFor::Nothing)
        .with_network("host")
        .with_label("org.prefixlog.test", "kafka-backend")
        .with_label("org.prefixlog.test.pid", std::process::id().to_string())
        .with_startup_timeout(START_TIMEOUT)
        .with_cmd([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
            // Relative to the image's WORKDIR, inside the container: gone with it.
            "--storage-engine",
            "sqlite://tansu.db",
        ])
        .start()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "starting a container from {name}:{tag} (a Docker engine and the image are needed: \
                 scripts/docker-engine.sh start && scripts/build-images.sh tansu): {e}"
            )
        })?;
    let brokers = format!("127.0.0.1:{port}");
    if let Err(e) = wait_for_metadata(&container, &brokers, started + START_TIMEOUT).await {
        let logs = async {
            let out = container.stdout_to_vec().await.unwrap_or_default();
            let err = container.stderr_to_vec().await.unwrap_or_default();
            format!("{}{}", String::from_utf8_lossy(&out), String::from_utf8_lossy(&err))
        };
        let logs = tokio::time::timeout(Duration::from_secs(10), logs).await.unwrap_or_default();
        anyhow::bail!("tansu container {} on {brokers}: {e:#}; its log:\n{logs}", container.id());
    }
    eprintln!(
        "[kafka backend] testcontainers: {name}:{tag} container {} on {brokers}, ready in {:.1}s",
        &container.id()[..12],
        started.elapsed().as_secs_f64()
    );
    Ok(KafkaBackend { name: "testcontainers", brokers, embedded: None, _container: Some(container) })
}

/// Ready = the port accepts connections and a metadata request is answered.
async fn wait_for_metadata(
    container: &ContainerAsync<GenericImage>,
    brokers: &str,
    deadline: Instant,
) -> anyhow::Result<()> {
    let mut last = String::from("never polled");
    while Instant::now() < deadline {
        if !container.is_running().await.unwrap_or(true) {
            let code = container.exit_code().await.ok().flatten();
            anyhow::bail!("the container exited (code {code:?})");
        }
        match tokio::net::TcpStream::connect(brokers).await {
            Err(e) => last = format!("connect: {e}"),
            Ok(_) => {
                let b = brokers.to_string();
                let md = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                    use rdkafka::consumer::{BaseConsumer, Consumer};
                    let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &b).create()?;
                    c.fetch_metadata(None, Duration::from_secs(5))?;
                    Ok(())
                })
                .await?;
                match md {
                    Ok(()) => return Ok(()),
                    Err(e) => last = format!("metadata: {e}"),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("not ready within {}s (last: {last})", START_TIMEOUT.as_secs())
}

/// A topic name unique within this process (tests share external brokers).
pub fn unique_topic(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{prefix}.{}.{}.{}", std::process::id(), nanos % 1_000_000_000, N.fetch_add(1, Ordering::Relaxed))
}

/// A loopback port that is free now, for a server another process will start on it (below
/// the kernel's ephemeral range: see [`prefixlog_node::loopback_port`]).
pub use prefixlog_node::loopback_port as listen_port;

/// A Python for a test's helper script: `$PREFIXLOG_VENV/bin/python`, else
/// `~/.cache/prefixlog/venv/bin/python`, else `python3`, the first one that runs `check`
/// (Python code, e.g. `import zmq, msgpack`) successfully; `None` when none does.
pub fn python_that_runs(check: &str) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    use std::process::{Command, Stdio};
    let venv = std::env::var_os("PREFIXLOG_VENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/prefixlog/venv")));
    let candidates = venv.map(|v| v.join("bin/python")).into_iter().chain([PathBuf::from("python3")]);
    candidates.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", check])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The Python for the bridge end-to-end tests (pyzmq + msgpack). Without one the test is not
/// run and says so, unless `PREFIXLOG_BRIDGE_E2E=required` (what `make test` sets): then it
/// fails.
pub fn bridge_e2e_python(test: &str) -> Option<std::path::PathBuf> {
    let py = python_that_runs("import zmq, msgpack");
    if py.is_none() {
        if std::env::var("PREFIXLOG_BRIDGE_E2E").as_deref() == Ok("required") {
            panic!("PREFIXLOG_BRIDGE_E2E=required but no python with pyzmq + msgpack was found");
        }
        eprintln!("[{test}] NOT RUN: pyzmq not installed (run scripts/test.sh, which installs it)");
    }
    py
}

/// Runs `python/bridge_fixtures/publisher.py` with `args` (the stand-in engines) to its end,
/// within 120 s; panics naming `backend` if it fails.
pub async fn run_bridge_publisher(py: &std::path::Path, args: &[String], backend: &str) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/bridge_fixtures/publisher.py");
    let mut child = tokio::process::Command::new(py)
        .arg(script)
        .args(args)
        .kill_on_drop(true)
        .spawn()
        .expect("python publisher starts");
    let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
        .await
        .expect("python publisher finishes within 120 s")
        .unwrap();
    assert!(status.success(), "{backend}: python publisher failed: {status}");
}

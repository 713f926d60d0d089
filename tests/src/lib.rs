//! Shared fixtures for prefixlog's cross-crate integration tests.
//!
//! [`kafka_backends`] yields every Kafka backend available to this run, in order:
//! 1. `testcontainers` with the official `apache/kafka-native` image (KRaft, single node) when a
//!    Docker engine is reachable; without one testcontainers fails within milliseconds and the
//!    backend is reported as not run;
//! 2. an external broker named by `PREFIXLOG_TEST_KAFKA=host:port` (e.g. tansu);
//! 3. the embedded librdkafka mock cluster (always).
//!
//! Tests run their body once per backend and print which backends ran, so none is silently
//! skipped.

pub mod http;
pub mod replicas;

use prefixlog_ingest::EmbeddedKafka;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use std::time::Duration;
use testcontainers::runners::AsyncRunner;
use testcontainers::ContainerAsync;
use testcontainers_modules::kafka::apache;

/// A reachable Kafka plus whatever keeps it alive.
pub struct KafkaBackend {
    pub name: &'static str,
    pub brokers: String,
    embedded: Option<EmbeddedKafka>,
    _container: Option<ContainerAsync<apache::Kafka>>,
}

impl KafkaBackend {
    /// Creates a topic (the mock cluster has no admin API; real brokers use it).
    pub async fn create_topic(&self, topic: &str, partitions: u32) -> anyhow::Result<()> {
        if let Some(e) = &self.embedded {
            e.create_topic(topic, partitions)?;
            return Ok(());
        }
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", &self.brokers).create()?;
        let t = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(1));
        let res = admin
            .create_topics([&t], &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))))
            .await?;
        for r in res {
            r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
        }
        Ok(())
    }
}

/// Every available backend; logs (to stderr) which ran and why others did not.
pub async fn kafka_backends() -> Vec<KafkaBackend> {
    let mut out = Vec::new();
    match apache::Kafka::default().start().await {
        Ok(c) => match c.get_host_port_ipv4(apache::KAFKA_PORT).await {
            Ok(port) => out.push(KafkaBackend {
                name: "testcontainers",
                brokers: format!("127.0.0.1:{port}"),
                embedded: None,
                _container: Some(c),
            }),
            Err(e) => eprintln!("[kafka backend] testcontainers: NOT RUN (container port: {e})"),
        },
        Err(e) => eprintln!("[kafka backend] testcontainers: NOT RUN (no Docker engine: {e})"),
    }
    if let Ok(b) = std::env::var("PREFIXLOG_TEST_KAFKA") {
        out.push(KafkaBackend { name: "external", brokers: b, embedded: None, _container: None });
    } else {
        eprintln!("[kafka backend] external: NOT RUN (PREFIXLOG_TEST_KAFKA not set)");
    }
    let e = EmbeddedKafka::start("prefixlog.fixture", 1).expect("embedded mock cluster starts");
    out.push(KafkaBackend {
        name: "embedded",
        brokers: e.bootstrap_servers(),
        embedded: Some(e),
        _container: None,
    });
    out
}

/// A topic name unique within this process (tests share external brokers).
pub fn unique_topic(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{prefix}.{}.{}.{}", std::process::id(), nanos % 1_000_000_000, N.fetch_add(1, Ordering::Relaxed))
}

/// A loopback port that is free now, for a server another process will start on it.
///
/// Below the kernel's ephemeral range (32768–60999 on Linux) on purpose: binding port 0 hands
/// out a port *in* that range, and clients that keep reconnecting to endpoints not listening yet
/// (the bridge's ZMQ sockets, librdkafka during a broker outage) open outgoing connections from
/// ephemeral ports too — one of them took such a port before the Python engine could bind it.
pub fn listen_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Processes (test binaries run side by side) start at different offsets.
    let start = std::process::id().wrapping_mul(7_919) % 14_000;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 14_000, "no free loopback port in 18000-31999");
        let port = 18_000 + (start + n) % 14_000;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
}

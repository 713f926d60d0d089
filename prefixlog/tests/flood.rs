//! Floods (issue 34): a plain Kafka producer (rdkafka, not the project's `Publisher`) writes
//! small well-formed records that each name something new — a keyspace, a holder, a lane or a
//! worker, one run per kind — at a `prefixlog serve` child process with the default limits.
//! Afterwards the replica is ready, its resident memory (its own /metrics,
//! `process_resident_memory_bytes`) grew by less than the README's bound, and the refused
//! records are counted in /metrics under their reason.
//!
//! `PREFIXLOG_FLOOD_RECORDS` sets the records per kind: 100,000 (the figure) unless set;
//! CI may set fewer. One partition, so that every per-partition limit is reached by one run.

use prefixlog_state::record::worker_key;
use prefixlog_state::StateSettings;
use prefixlog_tests::flood::FloodKind as Kind;
use prefixlog_tests::http::{http_get, sample};
use prefixlog_tests::{kafka_backends, unique_topic, KafkaBackend};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bound the README states: resident memory growth per flood kind.
const BOUND_BYTES: f64 = 256.0 * 1024.0 * 1024.0;
const RSS: &str = "process_resident_memory_bytes{shard=\"all\"}";

fn records() -> u64 {
    std::env::var("PREFIXLOG_FLOOD_RECORDS").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000)
}

/// The `serve` child, killed when dropped (also when an assertion fails first).
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(brokers: &str, topic: &str, admin: SocketAddr, log: &std::path::Path) -> Serve {
    Serve(
        Command::new(env!("CARGO_BIN_EXE_prefixlog"))
            .args(["serve", "--brokers", brokers, "--topic", topic, "--partitions", "1", "--ready-lag", "0"])
            .args(["--tick-interval", "0s", "--status-interval", "60s"])
            .args([
                "--grpc-addr",
                "127.0.0.1:0",
                "--peer-addr",
                "127.0.0.1:0",
                "--admin-addr",
                &admin.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("spawn prefixlog serve"),
    )
}

/// The replica's metrics once it is ready with `applied` records applied or skipped.
async fn ready_at(admin: SocketAddr, next: u64, within: Duration) -> String {
    let metric = "prefixlog_partition_next_offset{partition=\"0\",shard=\"all\"}";
    let t = Instant::now();
    loop {
        let (code, m) = http_get(admin, "/metrics").await;
        if code == 200 && sample(&m, metric) == Some(next as f64) && http_get(admin, "/readyz").await.0 == 200
        {
            return m;
        }
        assert!(t.elapsed() < within, "replica on {admin} not ready at offset {next} within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn produce(brokers: &str, topic: &str, kind: Kind, n: u64) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("a plain rdkafka producer");
    for i in 0..n {
        let (worker, value) = kind.record(i);
        let key = worker_key(worker);
        let mut rec = BaseRecord::to(topic).key(&key[..]).payload(&value[..]).partition(0);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    rec = r;
                    producer.poll(Duration::from_millis(10)); // queue full: let deliveries drain
                }
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).expect("every record delivered");
}

/// Floods one fresh replica with `kind` and checks it (module doc).
async fn flood(b: &KafkaBackend, kind: Kind, dir: &std::path::Path) {
    let n = records();
    let topic = unique_topic("prefixlog.flood");
    b.create_topic(&topic, 1).await.unwrap();
    let admin = SocketAddr::from(([127, 0, 0, 1], prefixlog_node::loopback_port()));
    let log = dir.join(format!("{}-{kind:?}.log", b.name));
    let child = serve(&b.brokers, &topic, admin, &log);
    let before = ready_at(admin, 0, Duration::from_secs(60)).await;
    let rss0 = sample(&before, RSS).expect("the replica reports its RSS");
    let t = Instant::now();
    let producer = {
        let (brokers, topic) = (b.brokers.clone(), topic.clone());
        tokio::task::spawn_blocking(move || produce(&brokers, &topic, kind, n))
    };
    producer.await.unwrap();
    let produced = t.elapsed();
    let after = ready_at(admin, n, Duration::from_secs(600)).await;
    let applied = t.elapsed();
    let rss1 = sample(&after, RSS).unwrap();
    let reason = kind.reason().unwrap_or("none");
    let skipped = format!("prefixlog_records_skipped_total{{reason=\"{reason}\",shard=\"all\"}}");
    let refused = sample(&after, &skipped).unwrap_or(0.0);
    let holders = sample(&after, "prefixlog_holders{shard=\"all\"}").unwrap_or(0.0);
    let keyspaces = sample(&after, "prefixlog_keyspaces{shard=\"all\"}").unwrap_or(0.0);
    drop(child);
    let growth = rss1 - rss0;
    let accepted = kind.accepted(n, &StateSettings::default());
    // RSS includes the consumer's prefetch queue and allocator slack, which vary from run to
    // run by tens of MiB (the control of ticks shows it): the exact state cost per record is
    // tests/tests/flood_cost.rs's.
    eprintln!(
        "[flood] {}: {kind:?}: {n} records (produced in {produced:.1?}, applied in {applied:.1?}): RSS {:.1} -> \
         {:.1} MiB (+{:.1} MiB, {:.0} B per record), {refused} refused ({reason}), {keyspaces} keyspaces, \
         {holders} holders",
        b.name,
        rss0 / 1048576.0,
        rss1 / 1048576.0,
        growth / 1048576.0,
        growth / n as f64,
    );
    assert!(growth < BOUND_BYTES, "{kind:?}: RSS grew by {:.1} MiB", growth / 1048576.0);
    if kind != Kind::Control {
        assert_eq!(refused as u64, n - accepted, "{kind:?}: the limit refused the excess ({skipped})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_new_keyspaces_holders_lanes_and_workers_stay_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        for kind in Kind::ALL {
            flood(&b, kind, dir.path()).await;
        }
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

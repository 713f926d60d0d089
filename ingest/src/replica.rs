//! The replica's ingest loop: Kafka → [`Applier`].
//!
//! A replica reads **every** partition itself (manual assignment, no consumer group: each
//! replica needs the full state), from the offsets its checkpoint says or the beginning, on one
//! dedicated thread that applies records of each partition strictly in offset order. Progress
//! (next offset, high watermark, log time per partition) is published through atomics in
//! [`ReplicaStatus`] and a `watch` channel, which read-your-writes queries wait on.

use crate::apply::{Applier, Outcome};
use crate::dead_letter::{DeadLetter, Source};
use parking_lot::Mutex;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    pub brokers: String,
    pub topic: String,
    pub partitions: u32,
    /// Extra librdkafka properties (SASL/SSL, tuning), applied last.
    pub properties: Vec<(String, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(
        "topic {topic:?} has {actual} partitions but this replica is configured for {expected}: \
         refusing to start (worker → partition placement would differ)"
    )]
    PartitionMismatch { topic: String, expected: u32, actual: u32 },
    #[error("topic {0:?} does not exist (create it with the configured partition count)")]
    NoTopic(String),
    #[error(
        "the dead-letter topic is the topic being consumed ({0:?}): every refused record would \
         be copied back and refused again, forever"
    )]
    DeadLetterIsSource(String),
}

/// Live progress of one partition.
#[derive(Default)]
pub struct PartitionStatus {
    pub next_offset: AtomicI64,
    pub high_watermark: AtomicI64,
    pub log_time: AtomicU64,
}

/// Progress of the whole replica, readable without locks.
pub struct ReplicaStatus {
    pub partitions: Vec<PartitionStatus>,
    /// False while the broker cannot be reached (the replica keeps serving its state).
    pub broker_ok: AtomicBool,
    pub records_applied: AtomicU64,
    pub records_skipped: AtomicU64,
    progress: watch::Sender<u64>,
}

impl ReplicaStatus {
    pub fn new(partitions: u32) -> Self {
        Self {
            partitions: (0..partitions).map(|_| PartitionStatus::default()).collect(),
            broker_ok: AtomicBool::new(true),
            records_applied: AtomicU64::new(0),
            records_skipped: AtomicU64::new(0),
            progress: watch::channel(0).0,
        }
    }

    /// Next offset to apply, per partition.
    pub fn offsets(&self) -> Vec<i64> {
        self.partitions.iter().map(|p| p.next_offset.load(Ordering::Acquire)).collect()
    }

    /// Records behind the high watermark, summed over partitions.
    pub fn lag(&self) -> i64 {
        self.partitions
            .iter()
            .map(|p| {
                (p.high_watermark.load(Ordering::Acquire) - p.next_offset.load(Ordering::Acquire)).max(0)
            })
            .sum()
    }

    /// True when every `(partition, offset)` has been applied (next offset beyond it).
    pub fn reached(&self, token: &[(u32, i64)]) -> bool {
        token.iter().all(|&(p, o)| {
            self.partitions.get(p as usize).is_some_and(|s| s.next_offset.load(Ordering::Acquire) > o)
        })
    }

    /// Waits until [`Self::reached`] or the timeout; returns whether it was reached.
    pub async fn wait_for(&self, token: &[(u32, i64)], timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.progress.subscribe();
        loop {
            if self.reached(token) {
                return true;
            }
            if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
                return self.reached(token);
            }
        }
    }

    fn notify(&self) {
        self.progress.send_modify(|g| *g += 1);
    }

    /// Publishes the applier's progress for one partition.
    pub fn publish(&self, p: u32, next_offset: i64, log_time: u64) {
        let s = &self.partitions[p as usize];
        s.next_offset.store(next_offset, Ordering::Release);
        s.log_time.store(log_time, Ordering::Release);
        self.notify();
    }
}

/// A running ingest loop.
pub struct Replica {
    applier: Arc<Mutex<Applier>>,
    status: Arc<ReplicaStatus>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Replica {
    /// Starts consuming every partition from the applier's next offsets. Refuses to start when
    /// the topic's partition count differs from the configured one.
    pub fn start(cfg: ReplicaConfig, applier: Applier) -> Result<Self, ReplicaError> {
        Self::start_with(cfg, applier, None)
    }

    /// [`Self::start`], copying every refused record to `dead_letter_topic` when given
    /// ([`crate::dead_letter`]).
    pub fn start_with(
        cfg: ReplicaConfig,
        applier: Applier,
        dead_letter_topic: Option<&str>,
    ) -> Result<Self, ReplicaError> {
        if dead_letter_topic == Some(cfg.topic.as_str()) {
            return Err(ReplicaError::DeadLetterIsSource(cfg.topic));
        }
        // Before any thread starts, so an error here leaves nothing running.
        let dead_letter = dead_letter_topic.map(|t| DeadLetter::new(&cfg, t)).transpose()?;
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &cfg.brokers)
            .set("group.id", "prefixlog-replica-unused")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "10");
        for (k, v) in &cfg.properties {
            cc.set(k, v);
        }
        let consumer: BaseConsumer = cc.create()?;
        let actual = topic_partitions(&consumer, &cfg.topic)?;
        if actual != cfg.partitions {
            return Err(ReplicaError::PartitionMismatch {
                topic: cfg.topic,
                expected: cfg.partitions,
                actual,
            });
        }
        let status = Arc::new(ReplicaStatus::new(cfg.partitions));
        let mut tpl = TopicPartitionList::new();
        for (p, st) in applier.partitions().iter().enumerate() {
            let off = if st.next_offset > 0 { Offset::Offset(st.next_offset) } else { Offset::Beginning };
            tpl.add_partition_offset(&cfg.topic, p as i32, off)?;
            status.publish(p as u32, st.next_offset, st.log_time);
        }
        consumer.assign(&tpl)?;
        let applier = Arc::new(Mutex::new(applier));
        let stop = Arc::new(AtomicBool::new(false));
        let watermarks = {
            let (status, stop, cfg) = (status.clone(), stop.clone(), cfg.clone());
            let wm: BaseConsumer = cc.create()?;
            std::thread::Builder::new()
                .name("prefixlog-watermarks".into())
                .spawn(move || poll_watermarks(wm, cfg, status, stop))
                .expect("spawn watermark thread")
        };
        let thread = {
            let (applier, status, stop) = (applier.clone(), status.clone(), stop.clone());
            let topic = cfg.topic.clone();
            std::thread::Builder::new()
                .name("prefixlog-ingest".into())
                .spawn(move || run(consumer, &topic, applier, status, stop, dead_letter))
                .expect("spawn ingest thread")
        };
        Ok(Self { applier, status, stop, threads: vec![thread, watermarks] })
    }

    pub fn status(&self) -> &Arc<ReplicaStatus> {
        &self.status
    }

    pub fn applier(&self) -> &Arc<Mutex<Applier>> {
        &self.applier
    }

    /// Stops the ingest thread and waits for it.
    pub fn stop(mut self) -> Arc<Mutex<Applier>> {
        self.shutdown();
        self.applier.clone()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The topic's partition count from broker metadata.
pub fn topic_partitions(consumer: &BaseConsumer, topic: &str) -> Result<u32, ReplicaError> {
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let t =
        md.topics().iter().find(|t| t.name() == topic).ok_or_else(|| ReplicaError::NoTopic(topic.into()))?;
    if t.error().is_some() || t.partitions().is_empty() {
        return Err(ReplicaError::NoTopic(topic.into()));
    }
    Ok(t.partitions().len() as u32)
}

fn run(
    consumer: BaseConsumer,
    topic: &str,
    applier: Arc<Mutex<Applier>>,
    status: Arc<ReplicaStatus>,
    stop: Arc<AtomicBool>,
    dead_letter: Option<DeadLetter>,
) {
    let mut last_err_log = Instant::now() - Duration::from_secs(60);
    while !stop.load(Ordering::Acquire) {
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(msg)) => {
                status.broker_ok.store(true, Ordering::Release);
                let p = msg.partition() as u32;
                let ts = msg.timestamp().to_millis().unwrap_or(0).max(0) as u64;
                let started = Instant::now();
                let (outcome, next, lt) = {
                    let mut a = applier.lock();
                    let o = a.apply(p, msg.offset(), ts, msg.payload());
                    let st = a.partition(p);
                    (o, st.next_offset, st.log_time)
                };
                apply_latency().observe(started.elapsed().as_secs_f64());
                match outcome {
                    Outcome::Applied => status.records_applied.fetch_add(1, Ordering::Relaxed),
                    Outcome::Bad(reason) => {
                        tracing::warn!(partition = p, offset = msg.offset(), %reason, "skipping bad record");
                        if let Some(d) = &dead_letter {
                            let src =
                                Source { topic, partition: p, offset: msg.offset(), reason: reason.as_str() };
                            d.copy(src, msg.key(), msg.payload());
                        }
                        status.records_skipped.fetch_add(1, Ordering::Relaxed)
                    }
                    _ => status.records_skipped.fetch_add(1, Ordering::Relaxed),
                };
                status.publish(p, next, lt);
            }
            Some(Err(e)) => {
                status.broker_ok.store(false, Ordering::Release);
                if last_err_log.elapsed() > Duration::from_secs(10) {
                    tracing::warn!(error = %e, "kafka consumer error; serving current state while retrying");
                    last_err_log = Instant::now();
                }
            }
            None => {}
        }
    }
}

/// High watermarks come from broker round trips, so they are polled on their own thread (and
/// client): a slow or unreachable broker never delays applying records already fetched.
fn poll_watermarks(
    consumer: BaseConsumer,
    cfg: ReplicaConfig,
    status: Arc<ReplicaStatus>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Acquire) {
        let mut ok = true;
        for p in 0..cfg.partitions {
            match consumer.fetch_watermarks(&cfg.topic, p as i32, Duration::from_secs(1)) {
                Ok((_, high)) => status.partitions[p as usize].high_watermark.store(high, Ordering::Release),
                Err(_) => ok = false,
            }
            if stop.load(Ordering::Acquire) {
                return;
            }
        }
        status.broker_ok.store(ok, Ordering::Release);
        status.notify();
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What the broker says about the log: its cluster id, the topic's partition count and the
/// high watermark of each partition. Used at start to refuse checkpoints of another log.
pub struct LogProbe {
    pub cluster_id: String,
    pub partitions: u32,
    pub high_watermarks: Vec<i64>,
    pub low_watermarks: Vec<i64>,
}

pub fn probe_log(cfg: &ReplicaConfig) -> Result<LogProbe, ReplicaError> {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &cfg.brokers).set("group.id", "prefixlog-probe-unused");
    for (k, v) in &cfg.properties {
        cc.set(k, v);
    }
    let consumer: BaseConsumer = cc.create()?;
    let partitions = topic_partitions(&consumer, &cfg.topic)?;
    let cluster_id = consumer.client().fetch_cluster_id(Duration::from_secs(10)).unwrap_or_default();
    let (mut low, mut high) = (Vec::new(), Vec::new());
    for p in 0..partitions {
        let (l, h) = consumer.fetch_watermarks(&cfg.topic, p as i32, Duration::from_secs(10))?;
        low.push(l);
        high.push(h);
    }
    Ok(LogProbe { cluster_id, partitions, high_watermarks: high, low_watermarks: low })
}

/// Time to decode and apply one record (including the applier lock), in prometheus' default
/// registry (the admin port's `/metrics` renders it).
fn apply_latency() -> &'static prometheus::Histogram {
    static H: std::sync::OnceLock<prometheus::Histogram> = std::sync::OnceLock::new();
    H.get_or_init(|| {
        let buckets = prometheus::exponential_buckets(1e-6, 2.0, 22).expect("valid buckets");
        let h = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "prefixlog_apply_latency_seconds",
                "Decode + apply time of one log record on the ingest thread",
            )
            .buckets(buckets),
        )
        .expect("valid histogram");
        let _ = prometheus::register(Box::new(h.clone()));
        h
    })
}

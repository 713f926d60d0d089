//! The replica's ingest loop: Kafka → [`LogReader`] → [`Applier`].
//!
//! One dedicated thread reads the owned partitions (manual assignment, no consumer group:
//! each replica needs the full state of its partitions) from the applier's next offsets and
//! applies each partition strictly in offset order. A second thread polls watermarks, so lag
//! is known even when nothing arrives. Progress is published through atomics in
//! [`ReplicaStatus`] and a `watch` channel, which read-your-writes queries wait on.
//!
//! A discontinuity (the log no longer continues a partition's state) is never papered over:
//! the partition is marked discontinuous (not ready, counted, logged with its offsets) and,
//! under [`GapPolicy::Halt`], stops being applied until its state is replaced
//! ([`Replica::replace_partition`], from a peer's checkpoint or a repair); under
//! [`GapPolicy::Accept`] (an operator's explicit opt-in) the applier moves past the lost
//! records and marks the partition's holders gapped. Replacements run on the ingest thread
//! between two records, so the swap never races an apply and never holds a lock across I/O.

use crate::affinity::CpuSet;
use crate::apply::{Applier, NotNext, Outcome};
use crate::dead_letter::{DeadLetter, DeadLetterCounts, Source};
use crate::log_spec::LogSpec;
use crate::reader::{Discontinuity, LogReader, Read};
use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(
        "the dead-letter topic is the topic being consumed ({0:?}): every refused record would \
         be copied back and refused again, forever"
    )]
    DeadLetterIsSource(String),
    #[error("the ingest thread has stopped")]
    Stopped,
    #[error("could not pin the ingest thread to CPUs {0}: {1}")]
    Pin(CpuSet, #[source] std::io::Error),
}

/// What the ingest loop does when the log does not continue a partition's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GapPolicy {
    /// Stop applying the partition; it stays discontinuous (not ready) until its state is
    /// replaced from a peer or the replica is restarted with a state the log continues.
    #[default]
    Halt,
    /// Move past the lost records and mark the partition's holders gapped (`--accept-log-gaps`).
    Accept,
}

/// Options of the ingest loop that do not change applied state.
#[derive(Clone, Debug, Default)]
pub struct IngestOptions {
    /// Copy every refused record to this topic ([`crate::dead_letter`]).
    pub dead_letter_topic: Option<String>,
    pub gap_policy: GapPolicy,
    /// Pin the ingest thread and its Kafka consumer's threads to these CPUs
    /// ([`crate::affinity`]); `None`: wherever the scheduler puts them.
    pub cpus: Option<CpuSet>,
}

/// Live progress of one partition.
#[derive(Default)]
pub struct PartitionStatus {
    pub next_offset: AtomicI64,
    pub low_watermark: AtomicI64,
    pub high_watermark: AtomicI64,
    pub log_time: AtomicU64,
    /// The log does not continue this partition's state (halted, or gap accepted and not yet
    /// cleared by a replacement).
    pub discontinuous: AtomicBool,
    /// Discontinuities found since start.
    pub discontinuities: AtomicU64,
    /// Whether the watermark thread has read this partition's watermarks yet.
    pub watermarks_known: AtomicBool,
    /// The log ended before this partition's state at the last watermark read (topic recreated
    /// or truncated). Decided against the next offset sampled *before* the broker round trip,
    /// so records applied meanwhile never make a stale watermark look like a rewind.
    pub rewound: AtomicBool,
}

/// Progress of the whole replica, readable without locks.
pub struct ReplicaStatus {
    /// Indexed by partition (every partition of the log; only owned ones move).
    pub partitions: Vec<PartitionStatus>,
    owned: Vec<u32>,
    /// False while the broker cannot be reached (the replica keeps serving its state).
    pub broker_ok: AtomicBool,
    pub records_applied: AtomicU64,
    pub records_skipped: AtomicU64,
    /// Decode + apply time of one record on the ingest thread (registered by the node).
    pub apply_latency: prometheus::Histogram,
    /// Copies of refused records to the dead-letter topic (zero without one).
    pub dead_letter: Arc<DeadLetterCounts>,
    progress: watch::Sender<u64>,
    /// Why the ingest thread stopped on a bug (a panic), if it did: the state no longer follows
    /// the log, so the replica is not ready.
    ingest_failure: Mutex<Option<String>>,
}

impl ReplicaStatus {
    pub fn new(partitions: u32, owned: &[u32]) -> Self {
        let buckets = prometheus::exponential_buckets(1e-6, 2.0, 22).expect("valid buckets");
        let apply_latency = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "prefixlog_apply_latency_seconds",
                "Decode + apply time of one log record on the ingest thread",
            )
            .buckets(buckets),
        )
        .expect("valid histogram");
        Self {
            partitions: (0..partitions).map(|_| PartitionStatus::default()).collect(),
            owned: owned.to_vec(),
            broker_ok: AtomicBool::new(true),
            records_applied: AtomicU64::new(0),
            records_skipped: AtomicU64::new(0),
            apply_latency,
            dead_letter: Arc::default(),
            progress: watch::channel(0).0,
            ingest_failure: Mutex::new(None),
        }
    }

    /// Why the ingest thread stopped on a bug, if it did ([`Self::record_ingest_failure`]).
    pub fn ingest_failure(&self) -> Option<String> {
        self.ingest_failure.lock().clone()
    }

    /// The ingest thread stopped on a bug (a panic, e.g. the two copies of a keyspace
    /// disagreeing): from now on the replica is not ready, and says why.
    pub fn record_ingest_failure(&self, why: String) {
        self.ingest_failure.lock().get_or_insert(why);
    }

    /// The owned partitions, ascending.
    pub fn owned(&self) -> &[u32] {
        &self.owned
    }

    fn part(&self, p: u32) -> &PartitionStatus {
        &self.partitions[p as usize]
    }

    /// Next offset to apply, per owned partition.
    pub fn offsets(&self) -> Vec<(u32, i64)> {
        self.owned.iter().map(|&p| (p, self.part(p).next_offset.load(Ordering::Acquire))).collect()
    }

    /// Records behind the high watermark, summed over owned partitions.
    pub fn lag(&self) -> i64 {
        self.owned.iter().map(|&p| self.partition_lag(p)).sum()
    }

    /// Records behind the last polled high watermark. Never negative: the watermark is polled
    /// while records are applied, so "next offset past the watermark" is usually just a stale
    /// poll. A real rewind is decided by the watermark thread and reported by
    /// [`Self::rewound`] (and its own gauge), not hidden in or inferred from this number.
    pub fn partition_lag(&self, p: u32) -> i64 {
        let s = self.part(p);
        (s.high_watermark.load(Ordering::Acquire) - s.next_offset.load(Ordering::Acquire)).max(0)
    }

    /// Owned partitions whose log ends before their state (topic recreated or truncated).
    pub fn rewound(&self) -> Vec<u32> {
        self.owned.iter().copied().filter(|&p| self.part(p).rewound.load(Ordering::Acquire)).collect()
    }

    /// Owned partitions the log does not continue right now.
    pub fn discontinuous(&self) -> Vec<u32> {
        self.owned.iter().copied().filter(|&p| self.part(p).discontinuous.load(Ordering::Acquire)).collect()
    }

    /// Owned partitions whose watermarks have not been read from the broker yet (their lag is
    /// unknown, not zero).
    pub fn watermarks_unknown(&self) -> Vec<u32> {
        self.owned
            .iter()
            .copied()
            .filter(|&p| !self.part(p).watermarks_known.load(Ordering::Acquire))
            .collect()
    }

    /// True when every record below each `(partition, next offset)` is applied. Partitions
    /// this replica does not own are ignored (another shard answers for them).
    pub fn reached(&self, token: &[(u32, i64)]) -> bool {
        token.iter().all(|&(p, o)| {
            self.owned.binary_search(&p).is_err() || self.part(p).next_offset.load(Ordering::Acquire) >= o
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
        let s = self.part(p);
        s.next_offset.store(next_offset, Ordering::Release);
        s.log_time.store(log_time, Ordering::Release);
        self.notify();
    }

    fn mark_discontinuous(&self, p: u32, on: bool) {
        let s = self.part(p);
        if on {
            s.discontinuities.fetch_add(1, Ordering::Relaxed);
        }
        s.discontinuous.store(on, Ordering::Release);
        self.notify();
    }
}

/// A request to the ingest thread.
enum Command {
    /// Replace partition `p`'s state with `src`'s and read on from `src`'s next offset.
    Replace { partition: u32, src: Box<Applier>, done: oneshot::Sender<()> },
}

/// A running ingest loop.
pub struct Replica {
    applier: Arc<Mutex<Applier>>,
    status: Arc<ReplicaStatus>,
    commands: Mutex<mpsc::Sender<Command>>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Replica {
    /// Starts reading `spec`'s owned partitions from the applier's next offsets.
    pub fn start(spec: &LogSpec, applier: Applier, opts: IngestOptions) -> Result<Self, ReplicaError> {
        if opts.dead_letter_topic.as_deref() == Some(spec.topic.as_str()) {
            return Err(ReplicaError::DeadLetterIsSource(spec.topic.clone()));
        }
        let status = Arc::new(ReplicaStatus::new(spec.partitions, spec.owned()));
        // Before any thread starts, so an error here leaves nothing running.
        let dead_letter = opts
            .dead_letter_topic
            .as_deref()
            .map(|t| DeadLetter::new(&spec.kafka, t, status.dead_letter.clone()))
            .transpose()?;
        for &p in spec.owned() {
            let st = applier.partition(p);
            status.publish(p, st.next_offset, st.log_time);
        }
        let start: Vec<(u32, i64)> =
            spec.owned().iter().map(|&p| (p, applier.partition(p).next_offset)).collect();
        // librdkafka's threads inherit the CPU set of the thread that creates the client, so a
        // pinned replica creates its consumer pinned (the new consumers of later resumes are
        // created on the ingest thread, pinned below).
        let reader = match &opts.cpus {
            None => LogReader::open(spec, start)?,
            Some(c) => c
                .run_pinned(|| LogReader::open(spec, start))
                .map_err(|e| ReplicaError::Pin(c.clone(), e))??,
        };
        let watermark_client: BaseConsumer = spec.client_config(crate::ClientRole::Probe).create()?;
        let applier = Arc::new(Mutex::new(applier));
        let stop = Arc::new(AtomicBool::new(false));
        let (commands, rx) = mpsc::channel();
        let watermarks = {
            let (status, stop, topic) = (status.clone(), stop.clone(), spec.topic.clone());
            std::thread::Builder::new()
                .name("prefixlog-watermarks".into())
                .spawn(move || poll_watermarks(watermark_client, &topic, status, stop))
                .expect("spawn watermark thread")
        };
        let ingest = {
            let mut ingest = Ingest {
                reader,
                topic: spec.topic.clone(),
                applier: applier.clone(),
                status: status.clone(),
                dead_letter,
                policy: opts.gap_policy,
            };
            let (stop, cpus, status) = (stop.clone(), opts.cpus, status.clone());
            std::thread::Builder::new()
                .name("prefixlog-ingest".into())
                .spawn(move || {
                    if let Some(c) = cpus {
                        // The same set was just applied to the thread that opened the reader.
                        match c.pin_current_thread() {
                            Ok(()) => tracing::info!(cpus = %c, "ingest thread pinned (--ingest-cpus)"),
                            Err(e) => {
                                tracing::warn!(cpus = %c, error = %e, "could not pin the ingest thread; it runs unpinned")
                            }
                        }
                    }
                    // A panic here is a bug, never input (bad records are skipped and counted).
                    // Left alone it would end the thread and leave the replica answering from a
                    // state that no longer follows the log, still "ready".
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ingest.run(&stop, &rx)));
                    if let Err(panic) = run {
                        let why = panic_message(panic.as_ref());
                        tracing::error!(
                            error = %why,
                            "the ingest thread stopped on a bug: this replica no longer follows the log and reports not ready; restart it (it restores its last checkpoint and replays the tail)"
                        );
                        status.record_ingest_failure(why);
                    }
                })
                .expect("spawn ingest thread")
        };
        Ok(Self {
            applier,
            status,
            commands: Mutex::new(commands),
            stop,
            threads: Mutex::new(vec![ingest, watermarks]),
        })
    }

    pub fn status(&self) -> &Arc<ReplicaStatus> {
        &self.status
    }

    pub fn applier(&self) -> &Arc<Mutex<Applier>> {
        &self.applier
    }

    /// Replaces partition `partition` with `src`'s state (rebuilt by a repair, or restored from
    /// a peer's checkpoint) on the ingest thread, between two records, then reads on from
    /// `src`'s next offset for it: records the live state had applied beyond it are applied
    /// again on the new state. Returns once the swap is done.
    pub async fn replace_partition(&self, partition: u32, src: Applier) -> Result<(), ReplicaError> {
        let (done, rx) = oneshot::channel();
        self.commands
            .lock()
            .send(Command::Replace { partition, src: Box::new(src), done })
            .map_err(|_| ReplicaError::Stopped)?;
        rx.await.map_err(|_| ReplicaError::Stopped)
    }

    /// Stops the ingest thread and waits for it; returns the applier (final checkpoint).
    pub fn stop(self) -> Arc<Mutex<Applier>> {
        self.halt();
        self.applier.clone()
    }

    /// Stops consuming and waits for the threads (idempotent). The state stays readable.
    pub fn halt(&self) {
        self.stop.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The ingest thread's state.
struct Ingest {
    reader: LogReader,
    topic: String,
    applier: Arc<Mutex<Applier>>,
    status: Arc<ReplicaStatus>,
    dead_letter: Option<DeadLetter>,
    policy: GapPolicy,
}

impl Ingest {
    fn run(&mut self, stop: &AtomicBool, commands: &mpsc::Receiver<Command>) {
        let mut last_err_log = Instant::now() - Duration::from_secs(60);
        while !stop.load(Ordering::Acquire) {
            while let Ok(c) = commands.try_recv() {
                self.command(c);
            }
            match self.reader.poll(Duration::from_millis(50)) {
                Read::Record(r) => {
                    self.status.broker_ok.store(true, Ordering::Release);
                    let (p, offset, ts) = (r.partition(), r.offset(), r.timestamp_ms());
                    let started = Instant::now();
                    let applied = {
                        let mut a = self.applier.lock();
                        a.apply(p, offset, ts, r.payload())
                            .map(|o| (o, a.partition(p).next_offset, a.partition(p).log_time))
                    };
                    self.status.apply_latency.observe(started.elapsed().as_secs_f64());
                    match applied {
                        Ok((outcome, next, lt)) => {
                            if let Outcome::Bad(reason) = outcome {
                                tracing::warn!(partition = p, offset, %reason, "skipping bad record");
                                if let Some(d) = &self.dead_letter {
                                    let src = Source {
                                        topic: &self.topic,
                                        partition: p,
                                        offset,
                                        reason: reason.as_str(),
                                    };
                                    d.copy(src, r.key(), r.payload());
                                }
                            }
                            drop(r);
                            count(&self.status, outcome);
                            self.status.publish(p, next, lt);
                        }
                        Err(NotNext { expected, offered, .. }) => {
                            drop(r);
                            // The reader checks continuity first; this is the applier's own check.
                            let found = crate::reader::Found::Offset(offered);
                            self.discontinuity(Discontinuity { partition: p, expected, found });
                        }
                    }
                }
                Read::Idle => {}
                Read::Discontinuity(d) => self.discontinuity(d),
                Read::BrokerError(e) => {
                    self.status.broker_ok.store(false, Ordering::Release);
                    if last_err_log.elapsed() > Duration::from_secs(10) {
                        tracing::warn!(error = %e, "kafka consumer error; serving current state while retrying");
                        last_err_log = Instant::now();
                    }
                }
            }
        }
    }

    fn discontinuity(&mut self, d: Discontinuity) {
        let p = d.partition;
        if let Err(e) = self.reader.halt(p) {
            tracing::warn!(partition = p, error = %e, "could not stop fetching a discontinuous partition");
        }
        self.status.mark_discontinuous(p, true);
        match self.policy {
            GapPolicy::Halt => tracing::error!(
                partition = p,
                expected = d.expected,
                found = ?d.found,
                "log discontinuity: {d}; the partition is halted (not ready) until its state is replaced \
                 from a peer (--peers / --bootstrap-from) or the replica restarts from a state the log \
                 continues (or with --accept-log-gaps)"
            ),
            GapPolicy::Accept => {
                let to = d.resume_offset();
                let (next, lt) = {
                    let mut a = self.applier.lock();
                    a.accept_gap(p, to);
                    (a.partition(p).next_offset, a.partition(p).log_time)
                };
                tracing::error!(
                    partition = p,
                    expected = d.expected,
                    resume_at = to,
                    "log discontinuity: {d}; --accept-log-gaps: reading on from {to}, every holder of \
                     the partition marked gapped"
                );
                self.status.publish(p, next, lt);
                // Counted above; the partition reads on, its holders flagged gapped.
                self.reader.resume_at(p, to);
                self.status.mark_discontinuous(p, false);
            }
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Replace { partition: p, src, done } => {
                let (next, lt) = {
                    let mut a = self.applier.lock();
                    a.replace_partition(p, &src);
                    (a.partition(p).next_offset, a.partition(p).log_time)
                };
                self.reader.resume_at(p, next);
                self.status.mark_discontinuous(p, false);
                self.status.publish(p, next, lt);
                tracing::info!(
                    partition = p,
                    next_offset = next,
                    "partition state replaced; reading on from its offset"
                );
                let _ = done.send(());
            }
        }
    }
}

fn count(status: &ReplicaStatus, outcome: Outcome) {
    let counter = if outcome == Outcome::Applied { &status.records_applied } else { &status.records_skipped };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Watermarks come from broker round trips, so they are polled on their own thread (and
/// client): a slow or unreachable broker never delays applying records already fetched.
fn poll_watermarks(consumer: BaseConsumer, topic: &str, status: Arc<ReplicaStatus>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        let mut ok = true;
        for &p in status.owned() {
            // Sampled before the round trip: every offset below it was fetched from the broker
            // earlier, so a watermark below it means the log really ends before the state.
            let applied_before = status.part(p).next_offset.load(Ordering::Acquire);
            match consumer.fetch_watermarks(topic, p as i32, Duration::from_secs(1)) {
                Ok((low, high)) => {
                    let s = status.part(p);
                    s.rewound.store(high < applied_before, Ordering::Release);
                    s.low_watermark.store(low, Ordering::Release);
                    s.high_watermark.store(high, Ordering::Release);
                    s.watermarks_known.store(true, Ordering::Release);
                }
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

/// The message of a caught panic (`panic!` with a string or a format).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

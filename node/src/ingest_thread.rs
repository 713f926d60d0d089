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
//! ([`IngestThread::replace_partition`], from a peer's checkpoint or a repair); under
//! [`GapPolicy::Accept`] (an operator's explicit opt-in) the applier moves past the lost
//! records and marks the partition's holders gapped. Replacements run on the ingest thread
//! between two records, so the swap never races an apply and never holds a lock across I/O.
//! A hole inside the log (offsets the broker skips: a transactional producer's markers or
//! aborted records) is recorded as a [`LogHole`] and explained by a second read on a thread of
//! its own, so that recovery never swaps in a state that would meet the same hole again.
//!
//! A panic while applying one record is a bug, never input (bad records are refused and
//! counted). It is caught for that record, under the applier lock: the applier is marked
//! failed (no checkpoint is taken of it from then on, [`Applier::failure`]), the partition is
//! halted at that record and reported ([`ReplicaStatus::apply_failures`]), and the other
//! partitions go on. A restart restores the last checkpoint and halts at the same record again:
//! a visible, counted halt of one partition, never a crash loop.

use parking_lot::Mutex;
use prefixlog_ingest::affinity::CpuSet;
use prefixlog_ingest::dead_letter::{DeadLetter, Source};
use prefixlog_ingest::log_spec::LogSpec;
use prefixlog_ingest::reader::{Discontinuity, Found, LogReader, Read};
use prefixlog_query::ReplicaStatus;
use prefixlog_state::apply::{Applier, ApplyFailure, NotNext, Outcome};
use prefixlog_state::NextOffset;
use prefixlog_state::{HoleCause, LogHole};
use rdkafka::consumer::BaseConsumer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
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

/// A request to the ingest thread.
enum Command {
    /// Replace partition `p`'s state with `src`'s and read on from `src`'s next offset.
    Replace { partition: u32, src: Box<Applier>, done: oneshot::Sender<()> },
}

/// A running ingest loop.
pub struct IngestThread {
    applier: Arc<Mutex<Applier>>,
    status: Arc<ReplicaStatus>,
    commands: Mutex<mpsc::Sender<Command>>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl IngestThread {
    /// Starts reading `spec`'s owned partitions from the applier's next offsets.
    pub fn start(spec: &LogSpec, applier: Applier, opts: IngestOptions) -> Result<Self, IngestError> {
        if opts.dead_letter_topic.as_deref() == Some(spec.topic.as_str()) {
            return Err(IngestError::DeadLetterIsSource(spec.topic.clone()));
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
        let start: Vec<NextOffset> =
            spec.owned().iter().map(|&p| NextOffset::new(p, applier.partition(p).next_offset)).collect();
        // librdkafka's threads inherit the CPU set of the thread that creates the client, so a
        // pinned replica creates its consumer pinned (the new consumers of later resumes are
        // created on the ingest thread, pinned below).
        let reader = match &opts.cpus {
            None => LogReader::open(spec, start)?,
            Some(c) => c
                .run_pinned(|| LogReader::open(spec, start))
                .map_err(|e| IngestError::Pin(c.clone(), e))??,
        };
        let watermark_client: BaseConsumer =
            spec.client_config(prefixlog_ingest::ClientRole::Probe).create()?;
        let applier = Arc::new(Mutex::new(applier));
        let stop = Arc::new(AtomicBool::new(false));
        let (commands, rx) = mpsc::channel();
        let watermarks = {
            let (status, stop, topic) = (status.clone(), stop.clone(), spec.topic.clone());
            std::thread::Builder::new()
                .name("prefixlog-watermarks".into())
                .spawn(move || crate::watermarks::poll(watermark_client, &topic, status, stop))
                .expect("spawn watermark thread")
        };
        let ingest = {
            let mut ingest = Ingest {
                reader,
                spec: spec.clone(),
                applier: applier.clone(),
                status: status.clone(),
                dead_letter,
                policy: opts.gap_policy,
                explaining: Arc::new(AtomicBool::new(false)),
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
                    // A panic here (outside applying a record, which `apply_one` catches) is a bug,
                    // never input. Left alone it would end the thread and leave the replica
                    // answering from a state that no longer follows the log, still "ready".
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
    pub async fn replace_partition(&self, partition: u32, src: Applier) -> Result<(), IngestError> {
        let (done, rx) = oneshot::channel();
        self.commands
            .lock()
            .send(Command::Replace { partition, src: Box::new(src), done })
            .map_err(|_| IngestError::Stopped)?;
        rx.await.map_err(|_| IngestError::Stopped)
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

impl Drop for IngestThread {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The ingest thread's state.
struct Ingest {
    reader: LogReader,
    spec: LogSpec,
    applier: Arc<Mutex<Applier>>,
    status: Arc<ReplicaStatus>,
    dead_letter: Option<DeadLetter>,
    policy: GapPolicy,
    /// A hole is being read again ([`Ingest::found_hole`]).
    explaining: Arc<AtomicBool>,
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
                    let applied = apply_one(&self.applier, p, offset, ts, r.payload());
                    self.status.apply_latency.observe(started.elapsed().as_secs_f64());
                    match applied {
                        Applied::Done(outcome, next, lt) => {
                            if let Outcome::Bad(reason) = outcome {
                                tracing::warn!(partition = p, offset, %reason, "skipping bad record");
                                if let Some(d) = &self.dead_letter {
                                    let src = Source {
                                        topic: &self.spec.topic,
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
                        Applied::NotNext(NotNext { expected, offered, .. }) => {
                            drop(r);
                            // The reader checks continuity first; this is the applier's own check.
                            let found = Found::Offset(offered);
                            self.discontinuity(Discontinuity { partition: p, expected, found });
                        }
                        Applied::Failed(f) => {
                            drop(r);
                            self.apply_failed(f);
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

    /// Halts the partition at the record whose apply failed; the others read on.
    fn apply_failed(&mut self, f: ApplyFailure) {
        let p = f.partition;
        if let Err(e) = self.reader.halt(p) {
            tracing::warn!(partition = p, error = %e, "could not stop fetching a failed partition");
        }
        tracing::error!(
            partition = p,
            offset = f.offset,
            error = %f.message,
            "applying a record failed (a bug, not bad input): the partition is halted at this record \
             (not ready), the other partitions go on, and no checkpoint is written from now on (the \
             state may hold part of the record). A restart resumes from the last checkpoint and halts \
             here again: report it with the partition and offset"
        );
        self.status.record_apply_failure(f);
    }

    fn discontinuity(&mut self, d: Discontinuity) {
        let p = d.partition;
        if let Err(e) = self.reader.halt(p) {
            tracing::warn!(partition = p, error = %e, "could not stop fetching a discontinuous partition");
        }
        // Before the partition shows as discontinuous: recovery must never see it without its hole.
        match d.found {
            Found::Offset(end) => {
                self.found_hole(LogHole { partition: p, start: d.expected, end, cause: None })
            }
            Found::LogStart(_) | Found::LogEnd { .. } => self.status.clear_hole(p),
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
                self.status.clear_hole(p);
                self.status.mark_discontinuous(p, false);
            }
        }
    }

    /// Records a hole in the log and explains it on a thread of its own (a second read of the
    /// hole, which may take seconds, must not hold up the other partitions). One such read at a
    /// time: holes met meanwhile (a transactional producer under `--accept-log-gaps` makes one
    /// per transaction) are counted unexplained rather than each opening a consumer.
    fn found_hole(&self, hole: LogHole) {
        self.status.record_hole(hole);
        if self.explaining.swap(true, Ordering::AcqRel) {
            self.status.hole_explained(hole, HoleCause::Unexplained);
            return;
        }
        let (spec, status, explaining) = (self.spec.clone(), self.status.clone(), self.explaining.clone());
        let spawned = std::thread::Builder::new().name("prefixlog-hole".into()).spawn(move || {
            let cause = prefixlog_ingest::continuity::explain_hole(&spec, &hole, HOLE_READ_TIMEOUT);
            let explained = LogHole { cause: Some(cause), ..hole };
            tracing::error!(
                partition = hole.partition,
                start = hole.start,
                end = hole.end,
                cause = cause.as_str(),
                "{explained}. prefixlog's topic must not be written with transactions \
                 (docs/operations.md, \"The topic\"): a state that ends before the hole meets it \
                 again, so no peer state that does is swapped in"
            );
            status.hole_explained(hole, cause);
            explaining.store(false, Ordering::Release);
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the thread that explains a log hole");
            self.status.hole_explained(hole, HoleCause::Unexplained);
            self.explaining.store(false, Ordering::Release);
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
                self.status.clear_hole(p);
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

/// How long the second read of a log hole may take.
const HOLE_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// What applying one record came to.
enum Applied {
    /// Applied or skipped; the partition's next offset and log time after it.
    Done(Outcome, i64, u64),
    NotNext(NotNext),
    /// It panicked: the applier is marked failed.
    Failed(ApplyFailure),
}

/// Applies one record under the applier lock, catching a panic for that record alone: the
/// applier is marked failed before the lock is released, so no checkpoint can capture the
/// state the panic left without seeing the mark.
fn apply_one(applier: &Mutex<Applier>, p: u32, offset: i64, ts: u64, value: Option<&[u8]>) -> Applied {
    let mut a = applier.lock();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.apply(p, offset, ts, value))) {
        Ok(Ok(outcome)) => Applied::Done(outcome, a.partition(p).next_offset, a.partition(p).log_time),
        Ok(Err(not_next)) => Applied::NotNext(not_next),
        Err(panic) => {
            let f = ApplyFailure { partition: p, offset, message: panic_message(panic.as_ref()) };
            a.mark_failed(f.clone());
            Applied::Failed(f)
        }
    }
}

fn count(status: &ReplicaStatus, outcome: Outcome) {
    let counter = if outcome == Outcome::Applied { &status.records_applied } else { &status.records_skipped };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The message of a caught panic (`panic!` with a string or a format).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// What repairs and peers may do with a running replica (they do not link Kafka).
impl prefixlog_state::LiveState for IngestThread {
    fn applier(&self) -> &Arc<Mutex<Applier>> {
        IngestThread::applier(self)
    }

    fn replace_partition(&self, partition: u32, src: Applier) -> prefixlog_state::log::Replacing<'_> {
        Box::pin(async move {
            IngestThread::replace_partition(self, partition, src)
                .await
                .map_err(prefixlog_state::LogError::new)
        })
    }
}

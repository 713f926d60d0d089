//! Prometheus metrics of a replica, by Prometheus conventions (counters end in `_total`,
//! durations in `_seconds`, Unix times in `_timestamp_seconds`, sizes in `_bytes`, one family
//! with a `reason` / `outcome` / `code` label instead of a family per value): query latency,
//! outcomes, matched depth and prompt length (recorded per request: their ratio is the hit
//! ratio), and the replica's progress, continuity and state size (read from `ReplicaStatus`,
//! the applier and the engine at scrape time, so the ingest path pays nothing for them).
//! Everything goes into the replica's own registry (the node adds its checkpoint, anti-entropy,
//! start-up and process metrics there); nothing is global. [`register_build_info`] and
//! [`render`] serve the bridge's registry too.

use crate::health::Readiness;
use crate::status::ReplicaStatus;
use parking_lot::{Mutex, RwLock};
use prefixlog_engine::{Engine, KeyspaceId};
use prefixlog_state::{Applier, HoleCause};
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Per-request metrics, shared by the gRPC service.
pub struct QueryMetrics {
    latency: Histogram,
    by_code: IntCounterVec,
    /// `by_code`'s OK child, resolved once: the common case skips the label lookup.
    ok: prometheus::IntCounter,
    depth: HistogramVec,
    prompt: HistogramVec,
    /// `depth`'s and `prompt`'s children per keyspace, resolved on a keyspace's first query:
    /// formatting the label and looking it up on every query cost more than the updates.
    by_keyspace: RwLock<HashMap<KeyspaceId, (Histogram, Histogram)>>,
    read_lock_wait: Histogram,
}

impl QueryMetrics {
    pub fn new(r: &Registry) -> prometheus::Result<Self> {
        // 10 µs .. ~1.3 s, doubling: a query is tens of µs, a consistency wait up to the deadline.
        let buckets = prometheus::exponential_buckets(10e-6, 2.0, 18)?;
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "prefixlog_query_latency_seconds",
                "Server-side Match latency (validation, consistency wait, match), per request",
            )
            .buckets(buckets),
        )?;
        let by_code = IntCounterVec::new(
            Opts::new("prefixlog_queries_total", "Match requests by gRPC status code"),
            &["code"],
        )?;
        // 0, 1, 2, 4, ... 8192 blocks: the hit-rate signal (how much of a prompt is cached).
        let mut depth_buckets = vec![0.0];
        depth_buckets.extend(prometheus::exponential_buckets(1.0, 2.0, 14)?);
        let depth = HistogramVec::new(
            HistogramOpts::new(
                "prefixlog_match_depth_blocks",
                "Matched depth of the best worker per answered Match, in blocks, per keyspace",
            )
            .buckets(depth_buckets.clone()),
            &["keyspace"],
        )?;
        // The same buckets: sum(depth) / sum(prompt length) is the share of prompt blocks the
        // best worker already holds (the index's hit ratio).
        let prompt = HistogramVec::new(
            HistogramOpts::new(
                "prefixlog_match_prompt_length_blocks",
                "Prompt length per answered Match, in blocks, per keyspace",
            )
            .buckets(depth_buckets),
            &["keyspace"],
        )?;
        // 1 µs .. ~1 s, doubling: uncontended is well under 1 µs.
        let read_lock_wait = Histogram::with_opts(
            HistogramOpts::new(
                "prefixlog_query_read_lock_wait_seconds",
                "Time a Match waited for its keyspace's read lock (held by the ingest thread's \
                 writes), per request",
            )
            .buckets(prometheus::exponential_buckets(1e-6, 2.0, 21)?),
        )?;
        r.register(Box::new(read_lock_wait.clone()))?;
        r.register(Box::new(latency.clone()))?;
        r.register(Box::new(by_code.clone()))?;
        r.register(Box::new(depth.clone()))?;
        r.register(Box::new(prompt.clone()))?;
        let ok = by_code.with_label_values(&[code_name(tonic::Code::Ok)]);
        Ok(Self { latency, by_code, ok, depth, prompt, by_keyspace: RwLock::default(), read_lock_wait })
    }

    pub fn observe(&self, d: Duration, err: Option<tonic::Code>) {
        self.latency.observe(d.as_secs_f64());
        match err {
            None => self.ok.inc(),
            Some(c) => self.by_code.with_label_values(&[code_name(c)]).inc(),
        }
    }

    pub fn observe_read_lock_wait(&self, d: Duration) {
        self.read_lock_wait.observe(d.as_secs_f64());
    }

    /// Records an answered query's best depth and its prompt's length, in blocks. Only
    /// keyspaces the engine holds reach here (an unknown one is NOT_FOUND first), so the
    /// per-keyspace cache is as bounded as the engine.
    pub fn observe_match(&self, keyspace: &KeyspaceId, depth: u32, prompt_blocks: usize) {
        let (depth, prompt) = (f64::from(depth), prompt_blocks as f64);
        if let Some((d, p)) = self.by_keyspace.read().get(keyspace) {
            d.observe(depth);
            return p.observe(prompt);
        }
        let label = keyspace.to_string();
        let (d, p) = (self.depth.with_label_values(&[&label]), self.prompt.with_label_values(&[&label]));
        d.observe(depth);
        p.observe(prompt);
        self.by_keyspace.write().insert(keyspace.clone(), (d, p));
    }
}

/// A gRPC status code's canonical name (`OK`, `INVALID_ARGUMENT`, ...), as grpc-go, grpc-java
/// and the gRPC spec spell it: the value of the `code` label.
pub fn code_name(c: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match c {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The build, as Prometheus' `<namespace>_build_info` convention has it: a gauge of 1 whose
/// labels name the version (the workspace's) and the source revision (`PREFIXLOG_REVISION` at
/// build time, e.g. a git commit; "unknown" without it). Joined onto other series in queries
/// (`* on (instance) group_left(version) prefixlog_build_info`).
pub fn register_build_info(r: &Registry) -> prometheus::Result<()> {
    let info = IntGaugeVec::new(
        Opts::new("prefixlog_build_info", "Always 1; the labels name this build"),
        &["version", "revision"],
    )?;
    info.with_label_values(&[
        env!("CARGO_PKG_VERSION"),
        option_env!("PREFIXLOG_REVISION").unwrap_or("unknown"),
    ])
    .set(1);
    r.register(Box::new(info))
}

/// The replica's progress and state, collected at scrape time.
pub struct StateCollector {
    engine: Arc<Engine>,
    status: Arc<ReplicaStatus>,
    applier: Option<Arc<Mutex<Applier>>>,
    readiness: Arc<Readiness>,
    descs: Vec<Desc>,
}

/// One scrape's metric objects (built fresh each time, so no stale label values linger).
struct Scrape {
    next_offset: IntGaugeVec,
    low: IntGaugeVec,
    high: IntGaugeVec,
    lag: IntGaugeVec,
    log_timestamp: prometheus::GaugeVec,
    rewound: IntGaugeVec,
    discontinuous: IntGaugeVec,
    discontinuities: IntCounterVec,
    apply_failures: IntCounterVec,
    holes: IntCounterVec,
    applied: prometheus::IntCounter,
    skipped: IntCounterVec,
    refused_stores: IntCounterVec,
    feed_gaps: prometheus::IntCounter,
    clamped: prometheus::IntCounter,
    gaps_accepted: prometheus::IntCounter,
    dead_letter: IntCounterVec,
    without_keyspace: prometheus::IntCounter,
    keyspaces: IntGauge,
    holders: IntGauge,
    holders_gapped: IntGauge,
    holder_blocks: IntGauge,
    heap: IntGauge,
    broker_up: IntGauge,
    broker_silent: prometheus::Gauge,
    topic_partitions: IntGauge,
    topic_partitions_changed: IntGauge,
    answers_stale: IntGauge,
    ready: IntGauge,
}

fn gv(name: &str, help: &str, label: &str) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid metric")
}
fn cv(name: &str, help: &str, label: &str) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric")
}
fn g(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("valid metric")
}
fn c(name: &str, help: &str) -> prometheus::IntCounter {
    prometheus::IntCounter::new(name, help).expect("valid metric")
}

impl Scrape {
    fn new() -> Self {
        Self {
            next_offset: gv(
                "prefixlog_partition_next_offset",
                "Next offset to apply, per owned partition",
                "partition",
            ),
            low: gv(
                "prefixlog_partition_low_watermark",
                "First offset the broker retains, per owned partition",
                "partition",
            ),
            high: gv(
                "prefixlog_partition_high_watermark",
                "Broker high watermark, per owned partition",
                "partition",
            ),
            lag: gv(
                "prefixlog_partition_lag",
                "Records between the next offset and the last polled high watermark, per owned partition",
                "partition",
            ),
            log_timestamp: prometheus::GaugeVec::new(
                Opts::new(
                    "prefixlog_partition_log_timestamp_seconds",
                    "Log time (the newest applied record timestamp) as a Unix time, per owned partition",
                ),
                &["partition"],
            )
            .expect("valid metric"),
            rewound: gv(
                "prefixlog_partition_rewound",
                "1 while the log ends before the partition's state (topic recreated or truncated; not ready)",
                "partition",
            ),
            discontinuous: gv(
                "prefixlog_partition_discontinuous",
                "1 while the log does not continue the partition's state (halted; not ready)",
                "partition",
            ),
            discontinuities: cv(
                "prefixlog_log_discontinuities_total",
                "Gaps, out-of-range offsets and rewinds found in the log, per partition",
                "partition",
            ),
            apply_failures: cv(
                "prefixlog_apply_failures_total",
                "Records whose apply failed (a bug; the partition halts at the record), per partition",
                "partition",
            ),
            holes: IntCounterVec::new(
                Opts::new(
                    "prefixlog_log_holes_total",
                    "Holes found inside the log (offsets no record is read at: a transactional \
                     producer's markers or aborted records), per partition and cause",
                ),
                &["partition", "cause"],
            )
            .expect("valid metric"),
            applied: c(
                "prefixlog_records_applied_total",
                "Records applied (owned partitions, since the log start)",
            ),
            skipped: cv("prefixlog_records_skipped_total", "Records skipped, by reason", "reason"),
            refused_stores: cv(
                "prefixlog_stores_refused_total",
                "Stores refused by the engine, by reason",
                "reason",
            ),
            feed_gaps: c(
                "prefixlog_feed_gaps_total",
                "Sequence gaps in engine event feeds (holders marked gapped)",
            ),
            clamped: c(
                "prefixlog_log_time_clamped_total",
                "Records whose timestamp moved log time too far (cut)",
            ),
            gaps_accepted: c("prefixlog_log_gaps_accepted_total", "Log gaps accepted by --accept-log-gaps"),
            dead_letter: cv(
                "prefixlog_dead_letter_copies_total",
                "Copies of refused records to the dead-letter topic, by outcome (copied, failed: dropped)",
                "outcome",
            ),
            without_keyspace: c(
                "prefixlog_writes_without_keyspace_total",
                "Removals, clears and refused stores for keyspaces that do not exist: no-ops that create \
                 nothing (since the process started)",
            ),
            keyspaces: g("prefixlog_keyspaces", "Keyspaces in the engine"),
            holders: g("prefixlog_holders", "Holders (worker, dp rank, lane) over all keyspaces"),
            holders_gapped: g("prefixlog_holders_gapped", "Holders whose event stream had a gap"),
            holder_blocks: g("prefixlog_holder_blocks", "Resident (holder, block) pairs"),
            heap: g("prefixlog_engine_heap_bytes", "Engine heap bytes (estimate)"),
            broker_up: g("prefixlog_broker_up", "1 while the broker is reachable"),
            broker_silent: prometheus::Gauge::new(
                "prefixlog_broker_silent_seconds",
                "Seconds since the broker last answered a complete watermark round",
            )
            .expect("valid metric"),
            topic_partitions: g(
                "prefixlog_topic_partitions",
                "The topic's partition count as the broker last reported it (0: not read yet)",
            ),
            topic_partitions_changed: g(
                "prefixlog_topic_partitions_changed",
                "1 while the broker reports another partition count than the replica was started for \
                 (not ready)",
            ),
            answers_stale: g(
                "prefixlog_answers_stale",
                "1 while answers without a consistency token say stale (not ready, or the broker \
                 silent longer than --stale-after)",
            ),
            ready: g("prefixlog_ready", "1 while the replica is ready (caught up, state proven)"),
        }
    }

    fn collectors(&self) -> Vec<&dyn Collector> {
        vec![
            &self.next_offset,
            &self.low,
            &self.high,
            &self.lag,
            &self.log_timestamp,
            &self.rewound,
            &self.discontinuous,
            &self.discontinuities,
            &self.apply_failures,
            &self.holes,
            &self.applied,
            &self.skipped,
            &self.refused_stores,
            &self.feed_gaps,
            &self.clamped,
            &self.gaps_accepted,
            &self.dead_letter,
            &self.without_keyspace,
            &self.keyspaces,
            &self.holders,
            &self.holders_gapped,
            &self.holder_blocks,
            &self.heap,
            &self.broker_up,
            &self.broker_silent,
            &self.topic_partitions,
            &self.topic_partitions_changed,
            &self.answers_stale,
            &self.ready,
        ]
    }
}

impl StateCollector {
    pub fn new(
        engine: Arc<Engine>,
        status: Arc<ReplicaStatus>,
        applier: Option<Arc<Mutex<Applier>>>,
        readiness: Arc<Readiness>,
    ) -> Self {
        let descs = Scrape::new().collectors().iter().flat_map(|c| c.desc().into_iter().cloned()).collect();
        Self { engine, status, applier, readiness, descs }
    }

    fn fill_progress(&self, s: &Scrape) {
        for &p in self.status.owned() {
            let l = [p.to_string()];
            let l = [l[0].as_str()];
            let st = &self.status.partitions[p as usize];
            s.next_offset.with_label_values(&l).set(st.next_offset.load(Ordering::Acquire));
            s.low.with_label_values(&l).set(st.low_watermark.load(Ordering::Acquire));
            s.high.with_label_values(&l).set(st.high_watermark.load(Ordering::Acquire));
            s.lag.with_label_values(&l).set(self.status.partition_lag(p));
            s.log_timestamp.with_label_values(&l).set(st.log_time.load(Ordering::Acquire) as f64 / 1e3);
            s.rewound.with_label_values(&l).set(i64::from(st.rewound.load(Ordering::Acquire)));
            s.discontinuous.with_label_values(&l).set(i64::from(st.discontinuous.load(Ordering::Acquire)));
            s.discontinuities.with_label_values(&l).inc_by(st.discontinuities.load(Ordering::Relaxed));
            s.apply_failures.with_label_values(&l).inc_by(st.apply_failures.load(Ordering::Relaxed));
            for cause in HoleCause::ALL {
                let n = self.status.holes_found(p, cause);
                s.holes.with_label_values(&[l[0], cause.as_str()]).inc_by(n);
            }
        }
        s.broker_up.set(i64::from(self.status.broker_ok.load(Ordering::Relaxed)));
        let dl = &self.status.dead_letter;
        s.dead_letter.with_label_values(&["copied"]).inc_by(dl.copied.load(Ordering::Relaxed));
        s.dead_letter.with_label_values(&["failed"]).inc_by(dl.failed.load(Ordering::Relaxed));
        s.broker_silent.set(self.status.since_broker_contact().as_secs_f64());
        s.topic_partitions.set(i64::from(self.status.partitions_observed().unwrap_or(0)));
        s.topic_partitions_changed.set(i64::from(self.status.partition_count_changed().is_some()));
        // The check refreshes the stale flag read below.
        s.ready.set(i64::from(self.readiness.check().0));
        s.answers_stale.set(i64::from(self.readiness.answers_stale()));
    }

    fn fill_counters(&self, s: &Scrape) {
        let Some(a) = &self.applier else {
            s.applied.inc_by(self.status.records_applied.load(Ordering::Relaxed));
            return;
        };
        let a = a.lock();
        for &p in self.status.owned() {
            let c = &a.partition(p).counters;
            s.applied.inc_by(c.applied);
            s.skipped.with_label_values(&["duplicate"]).inc_by(c.duplicates);
            s.skipped.with_label_values(&["stale_epoch"]).inc_by(c.stale_epochs);
            for (r, n) in &c.bad {
                s.skipped.with_label_values(&[r.as_str()]).inc_by(*n);
            }
            s.refused_stores.with_label_values(&["missing_parent"]).inc_by(c.missing_parents);
            s.refused_stores.with_label_values(&["invalid"]).inc_by(c.invalid_stores);
            s.feed_gaps.inc_by(c.gaps);
            s.clamped.inc_by(c.log_time_clamped);
            s.gaps_accepted.inc_by(c.log_gaps);
        }
    }

    fn fill_state(&self, s: &Scrape) {
        s.without_keyspace.inc_by(self.engine.writes_without_keyspace());
        let kss = self.engine.keyspaces();
        s.keyspaces.set(kss.len() as i64);
        for cell in kss {
            // Two copies (`--query-copy`) take twice the memory.
            let copies = cell.copy_count();
            let k = cell.read();
            let summaries = k.holder_summaries();
            s.holders.add(summaries.len() as i64);
            s.holders_gapped.add(summaries.iter().filter(|h| h.gapped).count() as i64);
            s.holder_blocks.add(k.holder_blocks() as i64);
            s.heap.add((k.heap_bytes() * copies) as i64);
        }
    }
}

impl Collector for StateCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let s = Scrape::new();
        self.fill_progress(&s);
        self.fill_counters(&s);
        self.fill_state(&s);
        s.collectors().iter().flat_map(|c| c.collect()).collect()
    }
}

/// The text exposition of a registry.
pub fn render(registry: &Registry) -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    let _ = prometheus::TextEncoder::new().encode(&registry.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

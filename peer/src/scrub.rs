//! The scrubber: a running replica checks the structures that answer its queries, a bounded
//! step at a time ([`prefixlog_engine::Keyspace::scrub_step`]), and repairs a partition they
//! disagree on.
//!
//! Anti-entropy compares digests, which are kept beside the trie; a corrupted membership list
//! or path leaves them intact — every peer agrees — while queries answer wrong. So, every
//! interval, the scrubber takes one step of at most `budget` units of work (blocks, members,
//! window segments) on one keyspace, under that keyspace's read lock only (both copies with
//! `--query-copy`), rotating through keyspaces in id order; everything is covered once per
//! pass. A finding is counted per partition, logged, and repaired off to the side like an
//! anti-entropy divergence ([`crate::repair::rebuild_and_swap`]); a finding that names no
//! partition is repaired through one partition of that keyspace (the transplant drops
//! members without a holder and recomputes the aggregates).

use crate::repair::{rebuild_and_swap, RepairContext, RepairOutcome};
use parking_lot::Mutex;
use prefixlog_engine::{Engine, KeyspaceId, ScrubCursor, ScrubFinding, ScrubStep};
use prefixlog_state::LiveState;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How much scrubbing a replica does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubOptions {
    /// One step this often (zero: no scrubbing).
    pub interval: Duration,
    /// Units of work per step (about 10 ns each: 20,000 held a keyspace's read lock for
    /// 0.2 ms typically and under 1 ms at the longest, measured in `engine/tests/scrub.rs`).
    pub budget: u64,
}

impl Default for ScrubOptions {
    fn default() -> Self {
        Self { interval: Duration::from_secs(1), budget: 20_000 }
    }
}

/// `prefixlog_scrub_*`.
pub struct ScrubStats {
    pub work: IntCounter,
    pub passes: IntCounter,
    /// Findings, per partition (`unknown` when a finding names none).
    pub findings: IntCounterVec,
    /// Repairs after a finding, per outcome.
    pub repairs: IntCounterVec,
    /// How long each step held a keyspace's read lock(s).
    pub hold: Histogram,
    pub last_pass: IntGauge,
}

impl ScrubStats {
    pub fn new() -> Self {
        let buckets = prometheus::exponential_buckets(1e-5, 2.0, 16).expect("valid buckets");
        Self {
            work: IntCounter::new(
                "prefixlog_scrub_work_units_total",
                "Scrub work done (blocks, members and window segments checked)",
            )
            .expect("valid metric"),
            passes: IntCounter::new("prefixlog_scrub_passes_total", "Scrub passes over every keyspace")
                .expect("valid metric"),
            findings: IntCounterVec::new(
                Opts::new(
                    "prefixlog_scrub_findings_total",
                    "Inconsistencies between query structures and digests, per partition",
                ),
                &["partition"],
            )
            .expect("valid metric"),
            repairs: IntCounterVec::new(
                Opts::new("prefixlog_scrub_repairs_total", "Repairs after a scrub finding, per outcome"),
                &["outcome"],
            )
            .expect("valid metric"),
            hold: Histogram::with_opts(
                HistogramOpts::new(
                    "prefixlog_scrub_lock_hold_seconds",
                    "How long one scrub step held a keyspace's read lock",
                )
                .buckets(buckets),
            )
            .expect("valid metric"),
            last_pass: IntGauge::new(
                "prefixlog_scrub_last_pass_timestamp_seconds",
                "When the last scrub pass over every keyspace ended",
            )
            .expect("valid metric"),
        }
    }

    pub fn register(&self, r: &Registry, partitions: &[u32]) -> prometheus::Result<()> {
        for p in partitions.iter().map(u32::to_string).chain(["unknown".into()]) {
            self.findings.with_label_values(&[p.as_str()]);
        }
        for o in ["repaired", "consistent", "failed"] {
            self.repairs.with_label_values(&[o]);
        }
        r.register(Box::new(self.work.clone()))?;
        r.register(Box::new(self.passes.clone()))?;
        r.register(Box::new(self.findings.clone()))?;
        r.register(Box::new(self.repairs.clone()))?;
        r.register(Box::new(self.hold.clone()))?;
        r.register(Box::new(self.last_pass.clone()))
    }
}

impl Default for ScrubStats {
    fn default() -> Self {
        Self::new()
    }
}

/// What one step found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub work: u64,
    /// The step finished a pass over every keyspace.
    pub pass_done: bool,
    pub finding: Option<(KeyspaceId, ScrubFinding)>,
    /// Partitions repaired after the finding.
    pub repaired: Vec<u32>,
}

/// Where the rotation stands: the keyspace being scrubbed and the cursor in it.
#[derive(Default)]
struct Rotation {
    keyspace: Option<KeyspaceId>,
    cursor: ScrubCursor,
}

pub struct Scrubber {
    replica: Arc<dyn LiveState>,
    ctx: RepairContext,
    pub stats: Arc<ScrubStats>,
    budget: u64,
    at: Mutex<Rotation>,
}

impl Scrubber {
    pub fn new(replica: Arc<dyn LiveState>, ctx: RepairContext, stats: Arc<ScrubStats>, budget: u64) -> Self {
        Self { replica, ctx, stats, budget, at: Mutex::new(Rotation::default()) }
    }

    /// Steps forever, one every `every`.
    pub async fn run(self: Arc<Self>, every: Duration) {
        let mut t = tokio::time::interval(every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            t.tick().await;
            self.step().await;
        }
    }

    /// Steps until a pass over every keyspace ends (tests, benchmarks); every step's report.
    pub async fn pass(&self) -> Vec<ScrubReport> {
        let mut out = Vec::new();
        loop {
            let r = self.step().await;
            let done = r.pass_done;
            out.push(r);
            if done {
                return out;
            }
        }
    }

    /// One step: the next `budget` units of the current keyspace (off the async workers),
    /// then a repair if it found something.
    pub async fn step(&self) -> ScrubReport {
        let engine = self.replica.applier().lock().engine().clone();
        let at = {
            let at = self.at.lock();
            Rotation { keyspace: at.keyspace.clone(), cursor: at.cursor }
        };
        let budget = self.budget;
        let stepped = match tokio::task::spawn_blocking(move || step_blocking(&engine, at, budget)).await {
            Ok(Some(s)) => s,
            Ok(None) => return ScrubReport { pass_done: true, ..Default::default() },
            Err(e) => {
                tracing::error!(error = %e, "scrub step failed (a bug); the next step goes on");
                return ScrubReport::default();
            }
        };
        self.stats.hold.observe(stepped.hold.as_secs_f64());
        let mut report = ScrubReport::default();
        let (id, next) = (stepped.keyspace, stepped.next);
        match stepped.result {
            Ok(step) => {
                self.stats.work.inc_by(step.work);
                report.work = step.work;
                let mut at = self.at.lock();
                if step.pass_done {
                    // On to the next keyspace; past the last one, a pass over all of them ends.
                    report.pass_done = next.is_none();
                    *at = Rotation { keyspace: next, cursor: ScrubCursor::default() };
                } else {
                    *at = Rotation { keyspace: Some(id), cursor: stepped.cursor };
                }
            }
            Err(finding) => {
                report.repaired = self.on_finding(&id, &finding).await;
                if report.repaired.is_empty() {
                    // Not repaired: the next pass finds it again and retries, not every step.
                    report.pass_done = next.is_none();
                    *self.at.lock() = Rotation { keyspace: next, cursor: ScrubCursor::default() };
                }
                report.finding = Some((id, finding));
            }
        }
        if report.pass_done {
            self.stats.passes.inc();
            self.stats.last_pass.set(now_s());
        }
        report
    }

    /// Counts, logs and repairs a finding; returns the partitions repaired.
    async fn on_finding(&self, id: &KeyspaceId, f: &ScrubFinding) -> Vec<u32> {
        let owned = &self.ctx.identity.owned;
        let labels: Vec<String> = if f.partitions.is_empty() {
            vec!["unknown".into()]
        } else {
            f.partitions.iter().map(u32::to_string).collect()
        };
        for l in &labels {
            self.stats.findings.with_label_values(&[l.as_str()]).inc();
        }
        let targets = self.repair_targets(id, f, owned);
        tracing::error!(
            keyspace = %id, partitions = ?f.partitions, error = %f.error, repairing = ?targets,
            "scrub: the structures that answer queries disagree with the digests (memory corruption \
             or a bug); rebuilding the partition from a checkpoint and the log"
        );
        let mut repaired = Vec::new();
        for p in targets {
            let outcome = rebuild_and_swap(&self.ctx, &*self.replica, p).await;
            let label = match &outcome {
                Ok(RepairOutcome::Repaired { from_checkpoint, swapped_at }) => {
                    tracing::warn!(
                        partition = p,
                        ?from_checkpoint,
                        swapped_at,
                        "scrub: partition rebuilt and swapped in"
                    );
                    repaired.push(p);
                    "repaired"
                }
                Ok(_) => "consistent",
                Err(e) => {
                    tracing::error!(partition = p, error = %e, "scrub: repair failed; the next pass finds it again and retries");
                    "failed"
                }
            };
            self.stats.repairs.with_label_values(&[label]).inc();
        }
        repaired
    }

    /// The owned partitions a finding names, or one owned partition with holders in the
    /// keyspace when it names none.
    fn repair_targets(&self, id: &KeyspaceId, f: &ScrubFinding, owned: &[u32]) -> Vec<u32> {
        let named: Vec<u32> =
            f.partitions.iter().copied().filter(|p| owned.binary_search(p).is_ok()).collect();
        if !named.is_empty() {
            return named;
        }
        let engine = self.replica.applier().lock().engine().clone();
        let with_holders = engine.keyspace(id).and_then(|k| {
            let g = k.read();
            owned.iter().copied().find(|&p| g.has_partition(p))
        });
        with_holders.or_else(|| owned.first().copied()).into_iter().collect()
    }
}

/// What one step on the blocking pool saw.
struct Stepped {
    keyspace: KeyspaceId,
    cursor: ScrubCursor,
    result: Result<ScrubStep, ScrubFinding>,
    /// How long the keyspace's read lock(s) were held.
    hold: Duration,
    /// The keyspace after this one in id order (None: this is the last).
    next: Option<KeyspaceId>,
}

/// Steps the rotation's keyspace (or, when it is gone, the first one) from its cursor. With
/// two copies both are stepped from the same cursor: their layouts are identical (the same
/// writes in the same order). None: there are no keyspaces.
fn step_blocking(engine: &Engine, at: Rotation, budget: u64) -> Option<Stepped> {
    let ids = engine.keyspace_ids();
    let (keyspace, start) = match at.keyspace.filter(|k| ids.contains(k)) {
        Some(k) => (k, at.cursor),
        None => (ids.first()?.clone(), ScrubCursor::default()),
    };
    let mut cursor = start;
    let cell = engine.keyspace(&keyspace)?;
    let t = Instant::now();
    let mut result = Ok(ScrubStep::default());
    for copy in &cell.copies() {
        let mut c = start;
        result = copy.scrub_step(&mut c, budget);
        if result.is_err() {
            break;
        }
        cursor = c;
    }
    let hold = t.elapsed();
    let next = ids.iter().position(|k| *k == keyspace).and_then(|i| ids.get(i + 1)).cloned();
    Some(Stepped { keyspace, cursor, result, hold, next })
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

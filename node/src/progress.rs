//! Start-up progress: what a starting replica is doing, for `/metrics` and `/readyz` while no
//! query port exists yet (loading a large checkpoint from disk or fetching one from a peer can
//! take minutes; an operator, a dashboard and a startup probe should see it move).
//!
//! Exported as `prefixlog_startup_phase{phase}` (1 for the current phase, 0 for the others),
//! `prefixlog_startup_phase_seconds` (time in the current phase) and
//! `prefixlog_restore_checkpoint_holder_blocks` (the size of the checkpoint being restored, 0
//! when none). Operator-facing only: nothing here reaches applied state.

use parking_lot::Mutex;
use prefixlog_query::admin::ReadyCheck;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Gauge, IntGauge, IntGaugeVec, Opts};
use std::sync::Arc;
use std::time::Instant;

/// Where a replica is in its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Reading the topic's metadata and the partitions' retained ranges.
    ProbingLog,
    /// Reading and verifying the newest usable local checkpoint.
    LoadingCheckpoint,
    /// Fetching a checkpoint from a peer (`--bootstrap-from`, or partitions the log no longer
    /// continues).
    FetchingCheckpoint,
    /// Building the in-memory state from the loaded checkpoint.
    Restoring,
    /// Checking the log continues every owned partition's state.
    ProvingContinuity,
    /// The query port is up; catching up with the log is measured by `prefixlog_partition_lag`.
    Serving,
}

impl Phase {
    pub const ALL: [Phase; 6] = [
        Phase::ProbingLog,
        Phase::LoadingCheckpoint,
        Phase::FetchingCheckpoint,
        Phase::Restoring,
        Phase::ProvingContinuity,
        Phase::Serving,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::ProbingLog => "probing_log",
            Phase::LoadingCheckpoint => "loading_checkpoint",
            Phase::FetchingCheckpoint => "fetching_checkpoint",
            Phase::Restoring => "restoring",
            Phase::ProvingContinuity => "proving_continuity",
            Phase::Serving => "serving",
        }
    }
}

struct State {
    phase: Phase,
    since: Instant,
    /// (checkpoint id or peer, holder blocks) of the checkpoint being restored.
    restoring: Option<(String, u64)>,
}

/// The start-up progress of one replica; a Prometheus collector and `/readyz`'s answer until
/// the replica serves. Clones share the progress (register one, update another).
#[derive(Clone)]
pub struct StartupProgress {
    state: Arc<Mutex<State>>,
    descs: Vec<Desc>,
}

impl Default for StartupProgress {
    fn default() -> Self {
        let descs = Families::new().collectors().iter().flat_map(|c| c.desc().into_iter().cloned()).collect();
        let state = State { phase: Phase::ProbingLog, since: Instant::now(), restoring: None };
        Self { state: Arc::new(Mutex::new(state)), descs }
    }
}

impl StartupProgress {
    pub fn enter(&self, phase: Phase) {
        let mut s = self.state.lock();
        if s.phase != phase {
            tracing::debug!(from = s.phase.as_str(), to = phase.as_str(), "start-up phase");
            s.phase = phase;
            s.since = Instant::now();
        }
    }

    /// The checkpoint being loaded or restored: `source` names it (an id, or a peer's address),
    /// `holder_blocks` its size.
    pub fn checkpoint(&self, source: impl Into<String>, holder_blocks: u64) {
        self.state.lock().restoring = Some((source.into(), holder_blocks));
    }

    pub fn phase(&self) -> Phase {
        self.state.lock().phase
    }
}

impl ReadyCheck for StartupProgress {
    fn check(&self) -> (bool, String) {
        let s = self.state.lock();
        let what = match (&s.restoring, s.phase) {
            (
                Some((src, blocks)),
                Phase::LoadingCheckpoint | Phase::FetchingCheckpoint | Phase::Restoring,
            ) => {
                format!(" ({src}, {blocks} holder blocks)")
            }
            _ => String::new(),
        };
        let secs = s.since.elapsed().as_secs();
        (false, format!("starting: {}{what} for {secs} s", s.phase.as_str().replace('_', " ")))
    }
}

/// One scrape's metric objects.
struct Families {
    phase: IntGaugeVec,
    seconds: Gauge,
    holder_blocks: IntGauge,
}

impl Families {
    fn new() -> Self {
        Self {
            phase: IntGaugeVec::new(
                Opts::new("prefixlog_startup_phase", "1 for the phase the replica's start is in"),
                &["phase"],
            )
            .expect("valid metric"),
            seconds: Gauge::new(
                "prefixlog_startup_phase_seconds",
                "Time spent in the current start-up phase",
            )
            .expect("valid metric"),
            holder_blocks: IntGauge::new(
                "prefixlog_restore_checkpoint_holder_blocks",
                "Holder blocks of the checkpoint the replica restores or restored (0: none)",
            )
            .expect("valid metric"),
        }
    }

    fn collectors(&self) -> [&dyn Collector; 3] {
        [&self.phase, &self.seconds, &self.holder_blocks]
    }
}

impl Collector for StartupProgress {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let f = Families::new();
        let s = self.state.lock();
        for p in Phase::ALL {
            f.phase.with_label_values(&[p.as_str()]).set(i64::from(p == s.phase));
        }
        f.seconds.set(s.since.elapsed().as_secs_f64());
        f.holder_blocks.set(s.restoring.as_ref().map_or(0, |(_, b)| *b as i64));
        f.collectors().iter().flat_map(|c| c.collect()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_phase_is_the_one_set_to_one() {
        let p = StartupProgress::default();
        let r = prometheus::Registry::new();
        r.register(Box::new(p.clone())).unwrap();
        p.enter(Phase::LoadingCheckpoint);
        p.checkpoint("checkpoint 7", 1234);
        let text = prefixlog_query::metrics::render(&r);
        assert!(text.contains("prefixlog_startup_phase{phase=\"loading_checkpoint\"} 1"), "{text}");
        assert!(text.contains("prefixlog_startup_phase{phase=\"serving\"} 0"), "{text}");
        assert!(text.contains("prefixlog_restore_checkpoint_holder_blocks 1234"), "{text}");
        let (ready, why) = p.check();
        assert!(!ready);
        assert!(
            why.starts_with("starting: loading checkpoint (checkpoint 7, 1234 holder blocks) for "),
            "{why}"
        );
        p.enter(Phase::Serving);
        assert!(prefixlog_query::metrics::render(&r).contains("prefixlog_startup_phase{phase=\"serving\"} 1"));
    }
}

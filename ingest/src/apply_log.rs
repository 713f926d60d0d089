//! Applying the log up to a fixed target: a log's records applied to an [`Applier`] from its
//! offsets up to the target, exactly (what databases call replaying a log; here "replay" is
//! left to the CLI that publishes a trace). Audits (the state at a past point), repairs (a
//! partition rebuilt off to the side) and benchmarks use it; the running replica tails the log
//! with the same [`LogReader`].
//!
//! [`apply_log`] either reaches its target or fails: a target beyond the log's end, a state the
//! log no longer continues, a discontinuity met on the way, or no progress within the idle
//! timeout (the broker is gone) are errors, never a partial result.

use crate::continuity::{check_offsets, OffsetProblem};
use crate::log_spec::{close_in_background, LogSpec};
use crate::probe::{probe_log, ProbeError};
use crate::reader::{Discontinuity, LogReader, Read};
use prefixlog_engine::LogTime;
use prefixlog_ids::NextOffset;
use prefixlog_state::apply::Applier;
use prefixlog_state::log::{ApplyLogOptions, LogError, LogProbe, LogSource, OnRecord, Until};
use prefixlog_state::partition_state::record_mark;
use prefixlog_state::StateSettings;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ApplyLogError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("partition {partition}: asked to apply the log up to offset {asked}, the log ends at {end}")]
    BeyondEnd { partition: u32, asked: i64, end: i64 },
    #[error(
        "partition {partition}: asked to apply the log up to offset {asked}, the state is already at {at}"
    )]
    Behind { partition: u32, asked: i64, at: i64 },
    #[error("the log does not continue the state: {0}")]
    NotContinued(OffsetProblem),
    #[error("log discontinuity while applying the log: {0}")]
    Discontinuity(Discontinuity),
    #[error(
        "no progress for {idle:?} (partition {partition} at {at}, target {target}): is the broker reachable?"
    )]
    Stalled { partition: u32, at: i64, target: i64, idle: Duration },
    #[error("the applier refused a record: {0}")]
    NotNext(#[from] prefixlog_state::apply::NotNext),
}

/// The end offset of every partition [`apply_log`] reads, from the target, the log's range and
/// each partition's next offset `at`.
fn ends(
    spec: &LogSpec,
    at: &dyn Fn(u32) -> i64,
    until: &Until,
    probe: &LogProbe,
) -> Result<BTreeMap<u32, i64>, ApplyLogError> {
    let mut ends = BTreeMap::new();
    match until {
        Until::Offsets(o) => {
            for (&p, &asked) in o {
                let (end, at) = (probe.high(p), at(p));
                if asked > end {
                    return Err(ApplyLogError::BeyondEnd { partition: p, asked, end });
                }
                if asked < at {
                    return Err(ApplyLogError::Behind { partition: p, asked, at });
                }
                ends.insert(p, asked);
            }
        }
        Until::Time(_) => {
            for &p in spec.owned() {
                ends.insert(p, probe.high(p).max(at(p)));
            }
        }
    }
    Ok(ends)
}

/// Where a read starts and stops, per partition: the next offset, the record before it to check
/// (offset and mark, for a state that names it) and the end.
struct Span {
    next: i64,
    verify: Option<(i64, u64)>,
    end: i64,
}

/// What [`drive`] does with each record in range.
type Sink<'s> = dyn FnMut(u32, i64, LogTime, Option<&[u8]>) -> Result<(), ApplyLogError> + 's;

/// Reads every span's records to its end (or past `until`'s time), calling `sink` with each;
/// returns the records passed to it.
fn drive(
    spec: &LogSpec,
    probe: &LogProbe,
    spans: BTreeMap<u32, Span>,
    until: &Until,
    idle_timeout: Duration,
    mut progress: Option<&mut dyn FnMut(u64, u64)>,
    sink: &mut Sink<'_>,
) -> Result<u64, ApplyLogError> {
    let mut open: BTreeMap<u32, i64> =
        spans.iter().filter(|(_, s)| s.next < s.end).map(|(&p, s)| (p, s.end)).collect();
    if open.is_empty() {
        return Ok(0);
    }
    if let Some(problem) =
        check_offsets(open.keys().map(|p| NextOffset::new(*p, spans[p].next)), probe).into_iter().next()
    {
        return Err(ApplyLogError::NotContinued(problem));
    }
    let total: u64 = open.iter().map(|(p, &e)| (e - spans[p].next) as u64).sum();
    // A state that names the record before its offset (a checkpoint's fingerprint) is read from
    // that record, which must be the same one: a recreated topic grown past the state is
    // another log (the record costs nothing extra: it comes in the same fetch).
    let mut verify: BTreeMap<u32, (i64, u64)> =
        open.keys().filter_map(|p| spans[p].verify.map(|v| (*p, v))).collect();
    let start = |p: u32| verify.get(&p).map_or(spans[&p].next, |v| v.0);
    let started = Instant::now();
    let mut first_record = None;
    let mut reader = LogReader::open_bounded(spec, open.keys().map(|&p| NextOffset::new(p, start(p))))?;
    let mut applied = 0u64;
    let mut last_progress = Instant::now();
    while !open.is_empty() {
        match reader.poll(Duration::from_millis(200)) {
            Read::Record(r) => {
                last_progress = Instant::now();
                first_record.get_or_insert_with(|| started.elapsed());
                let (p, offset) = (r.partition(), r.offset());
                let Some(&end) = open.get(&p) else { continue };
                if let Some(&(at, mark)) = verify.get(&p).filter(|v| v.0 == offset) {
                    if record_mark(r.timestamp_ms(), r.payload()) != mark {
                        return Err(ApplyLogError::NotContinued(OffsetProblem::Replaced {
                            partition: p,
                            state: at + 1,
                        }));
                    }
                    verify.remove(&p);
                    continue;
                }
                let past_time = matches!(until, Until::Time(t) if r.timestamp_ms() > *t);
                if offset >= end || past_time {
                    drop(r);
                    open.remove(&p);
                    reader.halt(p)?;
                    continue;
                }
                sink(p, offset, r.timestamp_ms(), r.payload())?;
                applied += 1;
                if offset + 1 >= end {
                    drop(r);
                    open.remove(&p);
                    reader.halt(p)?;
                }
                if let Some(f) = progress.as_mut() {
                    f(applied, total);
                }
            }
            Read::Discontinuity(d) => return Err(ApplyLogError::Discontinuity(d)),
            Read::Idle | Read::BrokerError(_) => {
                if last_progress.elapsed() >= idle_timeout {
                    let (&partition, &target) = open.iter().next().expect("an open partition");
                    let at = spans[&partition].next;
                    return Err(ApplyLogError::Stalled { partition, at, target, idle: idle_timeout });
                }
            }
        }
    }
    close_in_background(reader, "apply_log");
    tracing::info!(
        records = applied,
        partitions = spans.len(),
        secs = started.elapsed().as_secs_f64(),
        first_record_secs = first_record.unwrap_or_default().as_secs_f64(),
        "log read up to its target"
    );
    Ok(applied)
}

/// Applies records from the applier's next offsets up to `until`. Returns the records applied.
pub fn apply_log(
    spec: &LogSpec,
    applier: &mut Applier,
    until: &Until,
    mut opts: ApplyLogOptions<'_>,
) -> Result<u64, ApplyLogError> {
    let probed;
    let probe = match opts.probe {
        Some(p) => p,
        None => {
            probed = probe_log(spec)?;
            &probed
        }
    };
    let ends = ends(spec, &|p| applier.partition(p).next_offset, until, probe)?;
    let spans = ends
        .into_iter()
        .map(|(p, end)| {
            let s = applier.partition(p);
            let verify =
                (s.last_mark != 0 && s.next_offset > probe.low(p)).then(|| (s.next_offset - 1, s.last_mark));
            (p, Span { next: s.next_offset, verify, end })
        })
        .collect();
    let mut before_apply = opts.before_apply.take();
    let mut sink = |p: u32, offset: i64, t: LogTime, value: Option<&[u8]>| {
        if let Some(f) = before_apply.as_mut() {
            f(applier, p, offset, t, value);
        }
        applier.apply(p, offset, t, value)?;
        Ok(())
    };
    drive(spec, probe, spans, until, opts.idle_timeout, opts.progress.take(), &mut sink)
}

/// Reads the records [`apply_log`] would apply to a state at next offsets `from`, without
/// applying them (partitions not in `from` are not read). Returns the records read.
pub fn read_log(
    spec: &LogSpec,
    from: &BTreeMap<u32, i64>,
    until: &Until,
    probe: Option<&LogProbe>,
    on_record: &mut OnRecord<'_>,
) -> Result<u64, ApplyLogError> {
    let probed;
    let probe = match probe {
        Some(p) => p,
        None => {
            probed = probe_log(spec)?;
            &probed
        }
    };
    let at = |p: u32| from.get(&p).copied().unwrap_or(0);
    let spans = ends(spec, &at, until, probe)?
        .into_iter()
        .filter(|(p, _)| from.contains_key(p))
        .map(|(p, end)| (p, Span { next: at(p), verify: None, end }))
        .collect();
    let mut sink = |p: u32, offset: i64, t: LogTime, value: Option<&[u8]>| {
        on_record(p, offset, t, value);
        Ok(())
    };
    drive(spec, probe, spans, until, ApplyLogOptions::default().idle_timeout, None, &mut sink)
}

/// The Kafka log of a spec, for the layers that must not link Kafka (audits, repairs).
impl LogSource for LogSpec {
    fn topic(&self) -> &str {
        &self.topic
    }

    fn partitions(&self) -> u32 {
        self.partitions
    }

    fn owned(&self) -> &[u32] {
        LogSpec::owned(self)
    }

    fn settings(&self) -> StateSettings {
        self.settings
    }

    fn probe(&self) -> Result<LogProbe, LogError> {
        probe_log(self).map_err(LogError::new)
    }

    fn apply(
        &self,
        applier: &mut Applier,
        until: &Until,
        opts: ApplyLogOptions<'_>,
    ) -> Result<u64, LogError> {
        apply_log(self, applier, until, opts).map_err(LogError::new)
    }

    fn read(
        &self,
        from: &BTreeMap<u32, i64>,
        until: &Until,
        probe: Option<&LogProbe>,
        on_record: &mut OnRecord<'_>,
    ) -> Result<u64, LogError> {
        read_log(self, from, until, probe, on_record).map_err(LogError::new)
    }
}

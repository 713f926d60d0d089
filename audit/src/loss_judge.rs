//! [`judge_range`]: every placement in a range judged against the index at the offsets its
//! gateway's answer token named, exactly, in one read and one application of the range.
//!
//! A holder's state is a function of its own partition's records alone (a worker's records are
//! all in one partition: `prefixlog_state::apply`), so the index "at the token's offsets" is,
//! for every partition, that partition's holders after the records below the token's offset
//! for it. The range is read once (every record kept in memory, placements decoded), then each
//! partition's records are applied in order to a state holding only that partition, and every
//! placement's prompt is matched against it at the offset that placement needs there. A
//! placement's decision is the tally over all partitions.
//!
//! The offset a placement is judged at, per partition: the one its token names; for a partition
//! its token does not name (or a placement without a token), the placement's own offset on its
//! own partition and, on the others, the first record stamped after the placement's log time
//! (the state "as of" its log time). Offsets before the range start are judged at the start,
//! offsets past its end at the end.

use crate::loss::{LossOptions, LossReport, Placed, Tally};
use crate::reconstruct::{reconstruct, until_for, AuditError, Point};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::{Applier, LogSource};
use std::collections::BTreeMap;
use std::time::Instant;

/// One record of the range; its value is a span of its partition's `bytes`.
struct Rec {
    offset: i64,
    log_time: u64,
    value: Option<std::ops::Range<usize>>,
}

/// One partition's records of the range, in offset order, their values one after the other in
/// one buffer (not an allocation each), and the running maximum of their log times (for "the
/// first record stamped after T").
#[derive(Default)]
struct PartitionRecords {
    records: Vec<Rec>,
    bytes: Vec<u8>,
    max_time: Vec<u64>,
}

impl PartitionRecords {
    fn push(&mut self, offset: i64, log_time: u64, value: Option<&[u8]>) {
        let m = self.max_time.last().copied().unwrap_or(0).max(log_time);
        self.max_time.push(m);
        let value = value.map(|v| {
            self.bytes.extend_from_slice(v);
            self.bytes.len() - v.len()..self.bytes.len()
        });
        self.records.push(Rec { offset, log_time, value });
    }

    fn value(&self, r: &Rec) -> Option<&[u8]> {
        r.value.clone().map(|span| &self.bytes[span])
    }

    /// The index of the first record at or after offset `o`.
    fn at_offset(&self, o: i64) -> usize {
        self.records.partition_point(|r| r.offset < o)
    }

    /// The index of the first record stamped after `t`.
    fn after_time(&self, t: u64) -> usize {
        self.max_time.partition_point(|&m| m <= t)
    }

    /// The index of the record before which `pl` is judged on partition `q`.
    fn judged_before(&self, q: u32, pl: &Placed) -> usize {
        match pl.answered_on(q) {
            Some(o) => self.at_offset(o),
            None if q == pl.partition => self.at_offset(pl.offset),
            None => self.after_time(pl.log_time),
        }
    }
}

/// Judges every placement in `[from, to)` against the index at its answer token's offsets
/// (module doc): the state at `from` rebuilt as `reconstruct` does, then one read and one
/// application of the range.
pub fn judge_range(
    store: Option<&CheckpointStore>,
    log: &dyn LogSource,
    from: &Point,
    to: &Point,
    opts: &LossOptions,
) -> Result<LossReport, AuditError> {
    let started = Instant::now();
    let base = reconstruct(store, log, from, false)?;
    let starts: BTreeMap<u32, i64> =
        log.owned().iter().map(|&p| (p, base.applier.partition(p).next_offset)).collect();
    let probe = log.probe()?;
    let until = until_for(&base.applier, log, &probe, to)?;
    let partitions = log.partitions();
    let mut parts: BTreeMap<u32, PartitionRecords> =
        starts.keys().map(|&p| (p, Default::default())).collect();
    let mut placed: Vec<Placed> = Vec::new();
    log.read(&starts, &until, Some(&probe), &mut |p, offset, t, value| {
        placed.extend(Placed::of_record(partitions, p, offset, t, value));
        parts.entry(p).or_default().push(offset, t, value);
    })?;
    let read_secs = started.elapsed().as_secs_f64();
    placed.sort_by_key(|pl| (pl.log_time, pl.partition, pl.offset));
    let (tallies, replayed) = judge_partitions(&base.applier, &parts, &placed)?;
    tracing::info!(read_secs, judged_secs = started.elapsed().as_secs_f64(), "placements judged");
    let mut report = LossReport::new(opts);
    for (pl, tally) in placed.into_iter().zip(tallies) {
        let since = pl.answered_on(pl.partition).map_or(0, |o| (pl.offset - o).max(0));
        report.add(pl.decide(tally, since), opts.keep_decisions);
    }
    report.replayed = replayed;
    report.secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Every partition judged ([`judge_partition`]), on as many threads as the machine has cores
/// (partitions are independent); returns the tallies and the records applied.
fn judge_partitions(
    base: &Applier,
    parts: &BTreeMap<u32, PartitionRecords>,
    placed: &[Placed],
) -> Result<(Vec<Tally>, u64), AuditError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, parts.len().max(1));
    let parts: Vec<(&u32, &PartitionRecords)> = parts.iter().collect();
    let results: Vec<Result<(Vec<Tally>, u64), AuditError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<_> = parts.iter().skip(t).step_by(threads).copied().collect();
                scope.spawn(move || {
                    let mut tallies = vec![Tally::default(); placed.len()];
                    let mut replayed = 0;
                    for (&q, recs) in mine {
                        replayed += judge_partition(base, q, recs, placed, &mut tallies)?;
                    }
                    Ok((tallies, replayed))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a judging thread panicked")).collect()
    });
    let mut out = vec![Tally::default(); placed.len()];
    let mut replayed = 0;
    for r in results {
        let (tallies, n) = r?;
        replayed += n;
        for (o, t) in out.iter_mut().zip(tallies) {
            o.merge(t);
        }
    }
    Ok((out, replayed))
}

/// Applies partition `q`'s records to a state holding only that partition, matching every
/// placement's prompt when the partition reaches the offset it is judged at. Returns the
/// records applied.
fn judge_partition(
    base: &Applier,
    q: u32,
    recs: &PartitionRecords,
    placed: &[Placed],
    tallies: &mut [Tally],
) -> Result<u64, AuditError> {
    if recs.records.is_empty() && base.usage(q).holders() == 0 {
        return Ok(0); // no holder there, ever: nothing to match
    }
    let mut due: Vec<(usize, usize)> =
        placed.iter().enumerate().map(|(i, pl)| (recs.judged_before(q, pl), i)).collect();
    // Nearly in order already (placements are by log time): a stable sort runs through it.
    due.sort_by_key(|&(at, _)| at);
    let mut state = base.extract(&[q]);
    let mut matches = Vec::new();
    let mut judge = |state: &Applier, i: usize| {
        // Cheap skip: the partition holds nothing in the placement's keyspace (yet).
        if state.usage(q).uses(&placed[i].keyspace) {
            placed[i].matches_into(state, &mut matches);
            tallies[i].add(placed[i].holder, &matches);
        }
    };
    let mut next = due.iter().peekable();
    for (k, r) in recs.records.iter().enumerate() {
        while let Some(&(_, i)) = next.next_if(|(at, _)| *at <= k) {
            judge(&state, i);
        }
        state.apply(q, r.offset, r.log_time, recs.value(r)).map_err(prefixlog_state::LogError::new)?;
    }
    for &(_, i) in next {
        judge(&state, i);
    }
    Ok(recs.records.len() as u64)
}

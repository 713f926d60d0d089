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
use crate::reconstruct::{reconstruct_at, until_for, AuditError, Point};
use prefixlog_engine::{HolderMatch, KeyspaceId, SharedKeyspace};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::{Applier, LogSource, NextOffset};
use std::collections::{BTreeMap, HashMap};
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

    /// The index of the record before which placement `i` is judged on partition `q`; `near`
    /// is the answer for the placement before it in log time order, whose answer is usually
    /// this one's or a few records before it.
    fn judged_before(&self, q: u32, dues: &Dues, i: usize, near: usize) -> usize {
        let due = &dues.keys[i];
        match dues.answered_on(i, q) {
            Some(o) => first_from(&self.records, near, |r| r.offset < o),
            None if q == due.partition => first_from(&self.records, near, |r| r.offset < due.offset),
            None => first_from(&self.max_time, near, |&m| m <= due.log_time),
        }
    }
}

/// The first index of `v` where `before` is false (it is true on a prefix of `v`), looked for
/// from `near`: a few steps forward where the answer is at or just past it, a binary search
/// otherwise. Equals `v.partition_point(before)`.
fn first_from<T>(v: &[T], near: usize, before: impl Fn(&T) -> bool) -> usize {
    let mut k = near.min(v.len());
    if k > 0 && !before(&v[k - 1]) {
        return v[..k].partition_point(before);
    }
    for _ in 0..8 {
        if k == v.len() || !before(&v[k]) {
            return k;
        }
        k += 1;
    }
    k + v[k..].partition_point(before)
}

/// What finding where each placement is judged reads, for every placement, in two flat arrays
/// (each partition reads all of it: one heap vector per placement's token cost a cache miss
/// per placement and partition, the judge's largest cost at 64 partitions).
struct Dues {
    keys: Vec<DueKey>,
    /// The placements' keyspaces, each once.
    keyspaces: Vec<KeyspaceId>,
    /// Every placement's token, one after the other, each ordered by partition.
    tokens: Vec<NextOffset>,
}

struct DueKey {
    partition: u32,
    offset: i64,
    log_time: u64,
    /// The placement's token: a span of [`Dues::tokens`].
    token: std::ops::Range<usize>,
    /// Its keyspace: an index into [`Dues::keyspaces`].
    keyspace: usize,
}

impl Dues {
    fn new(placed: &[Placed]) -> Self {
        let mut tokens = Vec::with_capacity(placed.iter().map(|p| p.answered_at.len()).sum());
        let mut keyspaces: Vec<KeyspaceId> = Vec::new();
        let mut index: HashMap<&KeyspaceId, usize> = HashMap::new();
        let keys = placed
            .iter()
            .map(|pl| {
                let start = tokens.len();
                tokens.extend_from_slice(&pl.answered_at);
                let keyspace = *index.entry(&pl.keyspace).or_insert_with(|| {
                    keyspaces.push(pl.keyspace.clone());
                    keyspaces.len() - 1
                });
                DueKey {
                    partition: pl.partition,
                    offset: pl.offset,
                    log_time: pl.log_time,
                    token: start..tokens.len(),
                    keyspace,
                }
            })
            .collect();
        Self { keys, keyspaces, tokens }
    }

    /// [`Placed::answered_on`] of placement `i`.
    fn answered_on(&self, i: usize, q: u32) -> Option<i64> {
        let token = &self.tokens[self.keys[i].token.clone()];
        // A token naming every partition once, in order (what a replica's answer carries),
        // has q's entry at index q.
        let q_at = q as usize;
        if token.get(q_at).is_some_and(|a| a.partition == q) && (q_at == 0 || token[q_at - 1].partition < q) {
            return Some(token[q_at].offset);
        }
        let at = token.partition_point(|a| a.partition < q);
        token.get(at).filter(|a| a.partition == q).map(|a| a.offset)
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
    // One probe for both the base and the read (each costs round trips to every partition).
    let probe = log.probe()?;
    let base = reconstruct_at(store, log, &probe, from, false)?;
    let starts: BTreeMap<u32, i64> =
        log.owned().iter().map(|&p| (p, base.applier.partition(p).next_offset)).collect();
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
    let dues = &Dues::new(placed);
    let results: Vec<Result<(Vec<Tally>, u64), AuditError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<_> = parts.iter().skip(t).step_by(threads).copied().collect();
                scope.spawn(move || {
                    let mut tallies = vec![Tally::default(); placed.len()];
                    let mut replayed = 0;
                    for (&q, recs) in mine {
                        replayed += judge_partition(base, q, recs, (placed, dues), &mut tallies)?;
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
    (placed, dues): (&[Placed], &Dues),
    tallies: &mut [Tally],
) -> Result<u64, AuditError> {
    if recs.records.is_empty() && base.usage(q).holders() == 0 {
        return Ok(0); // no holder there, ever: nothing to match
    }
    let mut near = 0;
    let mut due: Vec<(usize, usize)> = (0..placed.len())
        .map(|i| {
            near = recs.judged_before(q, dues, i, near);
            (near, i)
        })
        .collect();
    // Nearly in order already (placements are by log time): a stable sort runs through it.
    due.sort_by_key(|&(at, _)| at);
    let mut state = base.extract(&[q]);
    let mut judge = Judge { placed, dues, q, cells: Vec::new(), matches: Vec::new() };
    let mut next = due.iter().peekable();
    for (k, r) in recs.records.iter().enumerate() {
        judge.new_stretch();
        while let Some(&(_, i)) = next.next_if(|(at, _)| *at <= k) {
            judge.judge(&state, i, &mut tallies[i]);
        }
        state.apply(q, r.offset, r.log_time, recs.value(r)).map_err(prefixlog_state::LogError::new)?;
    }
    judge.new_stretch();
    for &(_, i) in next {
        judge.judge(&state, i, &mut tallies[i]);
    }
    Ok(recs.records.len() as u64)
}

/// One partition's judging between two applied records: the placements' keyspaces as the
/// state has them (each looked up at most once per stretch of placements judged at the same
/// record, not once per placement), and one match buffer.
struct Judge<'a> {
    placed: &'a [Placed],
    dues: &'a Dues,
    q: u32,
    /// Per keyspace of [`Dues::keyspaces`], the state's keyspace (`Some(None)`: the state has
    /// none), once looked up in this stretch.
    cells: Vec<Option<Option<SharedKeyspace>>>,
    matches: Vec<HolderMatch>,
}

impl Judge<'_> {
    /// A record was applied: every keyspace is looked up again when next needed.
    fn new_stretch(&mut self) {
        self.cells.clear();
        self.cells.resize(self.dues.keyspaces.len(), None);
    }

    /// Adds placement `i`'s match on this partition, in `state` as it is now, to its tally:
    /// the full match where the chosen worker lives, the best holders elsewhere
    /// ([`Placed::best_in`]).
    fn judge(&mut self, state: &Applier, i: usize, tally: &mut Tally) {
        let k = self.dues.keys[i].keyspace;
        let keyspaces = &self.dues.keyspaces;
        let cell = self.cells[k].get_or_insert_with(|| state.engine().keyspace(&keyspaces[k]));
        let Some(cell) = cell else { return };
        let (pl, ks) = (&self.placed[i], cell.read());
        if pl.partition == self.q {
            pl.matches_in(&ks, &mut self.matches);
        } else {
            pl.best_in(&ks, &mut self.matches);
        }
        tally.add(pl.holder, &self.matches);
    }
}

#[cfg(test)]
mod tests {
    use super::first_from;

    /// `first_from` is `partition_point` from any starting point, forward, backward or far.
    #[test]
    fn first_from_is_partition_point_from_anywhere() {
        let v: Vec<i64> = (0..40).map(|i| i / 3 * 2).collect();
        for x in -1..=80 {
            let want = v.partition_point(|&y| y < x);
            for near in 0..=v.len() + 2 {
                assert_eq!(first_from(&v, near, |&y| y < x), want, "x {x} near {near}");
            }
        }
        assert_eq!(first_from(&[] as &[i64], 3, |&y| y < 1), 0);
    }
}

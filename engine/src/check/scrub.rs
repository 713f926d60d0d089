//! Scrubbing: [`Keyspace::check_invariants`] cut into steps of bounded cost, for a running
//! replica. A keyspace's digests are kept beside the trie, updated by every write; comparing
//! them with a peer's (anti-entropy) says nothing about the structures queries actually read
//! — the runs, their membership lists, the child links and paths `match_chain` walks. A
//! scrub recomputes what those structures say and compares it with the digests:
//!
//! - **runs**, a few at a time: each live run's shape, blocks, parent link, child lookup and
//!   paths (what a match walks), and each of its members: a live holder, in key order, and
//!   *justified* — the holder has an operation record with the member's stamp whose window
//!   covers the run. A member no record justifies is a block credited that no write stored:
//!   an overcount;
//! - **holders**, a few records at a time (a large holder spans steps): each holder's block
//!   count and digest recomputed from the membership of the runs its records cover (so, with
//!   the runs step, from the membership lists alone), its records' order and windows, its
//!   overrides, its card and partition;
//! - **totals**: every partition's digest and the keyspace's recomputed from the holders.
//!
//! A keyspace no larger than the budget is checked whole instead: [`Keyspace::check_invariants`]
//! in one step (which also covers the lookup tables and free lists, global passes a step of a
//! large keyspace leaves out). Every step takes at most about `budget` units of work (blocks,
//! members and window segments visited), plus the one run or record it stopped in, so the read
//! lock a step holds is bounded by the budget, not by the keyspace or its largest holder.
//!
//! Writes between steps may move what a cursor points at; a pass may then check something
//! twice or miss something new, and a later pass covers it. A holder written to while its check
//! spans steps is skipped for that pass (its next write would undo the sums anyway), so a holder
//! written during every pass's visit is the one thing a scrub may not reach. Each check is true
//! of any state between two writes, so concurrent writes never make a consistent keyspace fail.

use crate::check::invariants::check_override_maps;
use crate::keyspace::Keyspace;
use crate::partition::partition_of;
use crate::trie::Segment;
use crate::types::{ensure, HolderKey, InvariantError};

/// Where a scrub of one keyspace stands: a phase, the next run id or holder slot in it, and
/// how far into that holder's records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubCursor {
    /// The keyspace instance the cursor is in (0: none yet); another one starts a new pass.
    instance: u64,
    phase: Phase,
    next: u32,
    holder: HolderProgress,
}

/// A holder checked across steps, a few records at a time: what its records own so far, and
/// the keyspace's write sequence at the holder's last write when its check began. Any write to
/// the holder changes that (a renumbering of its stamps may leave its stamps, blocks and digest
/// looking the same), and so does another holder taking the slot; the check then skips it for
/// this pass. Writes to other holders (which may split the runs it holds) change
/// neither its blocks nor their terms, so the sums stay valid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct HolderProgress {
    record: u32,
    /// Overrides checked (after every record).
    overrides: u32,
    prev_stamp: u32,
    owned: u32,
    digest: u64,
    seen: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Start,
    Runs,
    Holders,
    Totals,
}

/// What one step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubStep {
    /// Units of work done (blocks, members and window segments visited).
    pub work: u64,
    /// The step finished a pass over the whole keyspace (the cursor is back at the start).
    pub pass_done: bool,
}

/// An inconsistency between the structures queries read and the digests, and the partitions
/// whose holders it concerns (empty: it names no holder, e.g. a member whose holder slot is
/// empty).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{error} (partitions {partitions:?})")]
pub struct ScrubFinding {
    pub partitions: Vec<u32>,
    pub error: InvariantError,
}

impl Keyspace {
    /// Size of the keyspace in scrub work units (what a whole check costs, roughly).
    pub fn scrub_size(&self) -> u64 {
        u64::from(self.trie.runs.slots()) + self.trie.live_blocks() as u64 + self.holders.slots.len() as u64
    }

    /// Checks the next part of the keyspace, about `budget` units of work, from `cursor`
    /// (advanced past what was checked). A finding leaves the cursor where it was found: the
    /// same step fails again until the keyspace is repaired.
    pub fn scrub_step(&self, cursor: &mut ScrubCursor, budget: u64) -> Result<ScrubStep, ScrubFinding> {
        let mut step = ScrubStep::default();
        let budget = budget.max(1);
        if cursor.instance != self.instance {
            // A new keyspace (or another one under the same id): a new pass.
            *cursor = ScrubCursor { instance: self.instance, ..Default::default() };
        }
        while step.work < budget {
            match cursor.phase {
                Phase::Start => {
                    let size = self.scrub_size();
                    if size <= budget {
                        self.check_invariants().map_err(|e| self.finding(e))?;
                        step.work += size;
                        step.pass_done = true;
                        return Ok(step);
                    }
                    *cursor = ScrubCursor { phase: Phase::Runs, next: 1, ..*cursor };
                }
                Phase::Runs if cursor.next >= self.trie.runs.slots() => {
                    *cursor = ScrubCursor { phase: Phase::Holders, next: 0, ..*cursor };
                }
                Phase::Runs => {
                    step.work += self.scrub_run(cursor.next).map_err(|e| self.finding(e))?;
                    cursor.next += 1;
                }
                Phase::Holders if cursor.next as usize >= self.holders.slots.len() => {
                    *cursor = ScrubCursor {
                        phase: Phase::Totals,
                        next: 0,
                        holder: HolderProgress::default(),
                        ..*cursor
                    };
                }
                Phase::Holders => {
                    let left = budget - step.work;
                    let (work, done) = self
                        .scrub_holder(cursor.next, &mut cursor.holder, left)
                        .map_err(|e| self.finding(e))?;
                    step.work += work;
                    if done {
                        cursor.next += 1;
                        cursor.holder = HolderProgress::default();
                    }
                }
                Phase::Totals => {
                    self.check_holder_index().map_err(|e| self.finding(e))?;
                    self.check_aggregates().map_err(|e| self.finding(e))?;
                    step.work += self.holders.slots.len() as u64;
                    *cursor = ScrubCursor { instance: self.instance, ..Default::default() };
                    step.pass_done = true;
                    return Ok(step);
                }
            }
        }
        Ok(step)
    }

    /// One run: its structure, and that every member is a live holder, in key order, with a
    /// record that stamped this run. Returns the work done.
    fn scrub_run(&self, r: u32) -> Result<u64, InvariantError> {
        let trie = &self.trie;
        let run = &trie.runs[r];
        if !run.live() {
            return Ok(1);
        }
        trie.check_run(r, None)?;
        let mut work = 1 + u64::from(run.len);
        let mut window: Vec<Segment> = Vec::new();
        for (k, m) in run.members.iter().enumerate() {
            let member = |what| InvariantError::Member { run: r, holder: m.holder, what };
            let holder = self.check_member(r, k)?;
            let rec =
                holder.records.binary_search_by_key(&m.stamp, |x| x.stamp).ok().map(|i| holder.records[i]);
            let Some(rec) = rec else { return Err(member("no record of the holder has the member's stamp")) };
            ensure(rec.leaf < trie.blocks.top(), || member("the stamping record's leaf is out of range"))?;
            trie.window(rec.leaf, rec.len, &mut window);
            work += window.len() as u64;
            let covered =
                window.iter().any(|&(wr, first, count)| wr == r && first == run.start && count == run.len);
            ensure(covered, || member("the record with the member's stamp does not cover the run"))?;
        }
        Ok(work + run.members.len() as u64)
    }

    /// Part of one holder's check, at most about `budget` units: at its start, its card and
    /// partition; then its records, a few at a time (their order, windows and the runs they
    /// own, with those runs' digest terms); at its end, that the blocks and digest its records
    /// own are the holder's, and its overrides. Returns the work done and whether the holder
    /// is done (checked, gone, or skipped because a write changed it meanwhile).
    fn scrub_holder(
        &self,
        slot: u32,
        at: &mut HolderProgress,
        budget: u64,
    ) -> Result<(u64, bool), InvariantError> {
        let Some(h) = self.holders.slots[slot as usize].as_ref() else { return Ok((1, true)) };
        let seen = h.last_write;
        if at.record == 0 {
            self.check_card(slot, h)?;
            at.seen = seen;
        } else if at.seen != seen {
            return Ok((1, true));
        }
        let trie = &self.trie;
        let (mut work, mut window) = (1u64, Vec::new());
        while (at.record as usize) < h.records.len() && work < budget {
            let rec = &h.records[at.record as usize];
            at.owned += self.check_record(slot, h, rec, at.prev_stamp, at.owned, &mut window)?;
            for &(r, _, count) in &window {
                work += 1 + u64::from(count);
                if trie.runs[r].has(slot, rec.stamp) {
                    at.digest = at.digest.wrapping_add(trie.terms(r, 0, trie.runs[r].len, !h.fed));
                }
            }
            (at.prev_stamp, at.record) = (rec.stamp, at.record + 1);
        }
        if (at.record as usize) < h.records.len() {
            return Ok((work, false));
        }
        if at.overrides == 0 {
            let (owned, blocks) = (at.owned, h.blocks);
            ensure(owned == blocks, || InvariantError::Ownership { holder: h.key, owned, blocks })?;
            let recomputed = at.digest;
            ensure(recomputed == h.digest, || InvariantError::HolderDigest {
                holder: h.key,
                stored: h.digest,
                recomputed,
            })?;
        }
        // The overrides, a few at a time too (a holder whose engine hashes with its own seed
        // has one per block). The map's order is fixed while the holder is unchanged.
        let take = budget.saturating_sub(work).max(1) as usize;
        for (&ext, &b) in h.overrides.iter().skip(at.overrides as usize).take(take) {
            self.check_override(slot, h, ext, b)?;
            (work, at.overrides) = (work + 1, at.overrides + 1);
        }
        if (at.overrides as usize) < h.overrides.len() {
            return Ok((work, false));
        }
        check_override_maps(h)?;
        Ok((work, true))
    }

    /// The finding for `error`, with the partitions it concerns.
    fn finding(&self, error: InvariantError) -> ScrubFinding {
        let n = self.cfg.partitions;
        let of_key = |k: &HolderKey| vec![partition_of(k.worker, n)];
        let partitions = match &error {
            InvariantError::HolderBlocks { holder, .. }
            | InvariantError::HolderDigest { holder, .. }
            | InvariantError::Record { holder, .. }
            | InvariantError::Ownership { holder, .. }
            | InvariantError::Override { holder, .. } => of_key(holder),
            InvariantError::HolderPartition { holder, group, .. } => {
                let mut v = vec![*group, partition_of(holder.worker, n)];
                v.sort_unstable();
                v.dedup();
                v.retain(|&p| p < n.max(1));
                v
            }
            InvariantError::HolderIndex { slot: holder, .. } | InvariantError::Member { holder, .. } => self
                .holders
                .slots
                .get(*holder as usize)
                .and_then(Option::as_ref)
                .map_or_else(Vec::new, |h| of_key(&h.key)),
            InvariantError::Aggregate { what, .. } => what
                .strip_prefix("partition ")
                .and_then(|s| s.strip_suffix(" digest"))
                .and_then(|s| s.parse().ok())
                .map_or_else(Vec::new, |p| vec![p]),
            _ => Vec::new(),
        };
        ScrubFinding { partitions, error }
    }
}

//! The walks of a match down the trie, run by run: the query's locals compared with a run's
//! as one slice, the run's members credited once for the whole stretch.
//!
//! Never overcount: a holder's depth only advances at position `i` if the holder is a member
//! of the run at `i` *and* its depth is already `i`. A holder that holds later blocks but
//! misses an earlier one (an evicted head or a hole in the middle) stops at the hole.
//!
//! Two walks: depth only, with early exit and per-thread scratch ([`Keyspace::match_depth`];
//! per holder, or per slot for the tier path), and every position with intervals
//! ([`Keyspace::match_full`]). Both honour the query's holder filters ([`Filter`]).

use crate::keyspace::Keyspace;
use crate::trie::{common_prefix, Run, ROOT};
use crate::types::Tier;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

/// A holder's progress along the query in [`Keyspace::match_full`].
#[derive(Default)]
pub(crate) struct Acc {
    pub depth: u32,
    /// Half-open, sorted, disjoint. Inline up to two: most holders hold one stretch of a
    /// query, and the tier path builds one per holder of every slot it reports.
    pub intervals: SmallVec<[(u32, u32); 2]>,
}

impl Acc {
    /// The holder holds positions `from..to`, met in query order.
    #[inline]
    pub fn credit(&mut self, from: u32, to: u32) {
        if self.depth == from {
            self.depth = to;
        }
        match self.intervals.last_mut() {
            Some(last) if last.1 == from => last.1 = to,
            _ => self.intervals.push((from, to)),
        }
    }
}

/// The holder filters of [`MatchOptions`], with the candidate list sorted.
pub(crate) struct Filter<'a> {
    pub lane: Option<u32>,
    pub candidates: Option<&'a [u64]>,
    pub exclude_gapped: bool,
    /// The counted tiers (only set where holders off the GPU exist).
    pub tiers: Option<&'a [Tier]>,
}

impl Filter<'_> {
    /// No filter: the hot loop skips the holder lookup.
    #[inline]
    pub(crate) fn is_none(&self) -> bool {
        self.lane.is_none() && self.candidates.is_none() && !self.exclude_gapped && self.tiers.is_none()
    }
}

impl Keyspace {
    /// Whether the options let `holder` be reported.
    pub(crate) fn holder_ok(&self, f: &Filter, holder: u32) -> bool {
        let h = self.holders.card(holder);
        let key = h.key();
        f.lane.is_none_or(|l| key.lane == l)
            && f.tiers.is_none_or(|t| t.contains(&key.tier))
            && !(f.exclude_gapped && h.gapped)
            && f.candidates.is_none_or(|c| c.binary_search(&key.worker).is_ok())
    }

    /// Depth only, with early exit. The walk goes run by run: the query's locals are compared
    /// with the run's as one slice, and the run's members are credited once for the whole
    /// matched stretch.
    ///
    /// A holder's progress is its *stage*: how many of the extending runs so far it was
    /// extended by (a dense per-thread array indexed by holder slot, no hashing). It may extend
    /// at a run only if it was extended by every extending run before it, i.e. its stage is
    /// the number of runs so far: contiguous from position 0, never past a hole.
    ///
    /// While one run is compared, the next one's record (or the edge table slot that finds
    /// it) is already being loaded, and its locals once its record is in: a query's walk is a
    /// chain of dependent loads, and these overlap them with the work on the current run.
    ///
    /// With `BY_SLOT`, progress is kept per slot instead (indexed by the slot's leader, see
    /// `Holders::leader`): a slot extends at a run if any of its counted tiers is a member,
    /// which is the tier path's combined depth (`super::tiers`), and `s.runs` records the run
    /// each stage began at.
    pub(crate) fn match_depth<const BY_SLOT: bool>(&self, locals: &[u64], f: &Filter, s: &mut Scratch) {
        if s.stage.len() < self.holders.slots.len() {
            s.stage.resize(self.holders.slots.len(), 0);
        }
        s.touched.clear();
        s.ends.clear();
        s.reached.clear();
        s.runs.clear();
        let trie = &self.trie;
        let mut i = 0usize;
        let mut next = locals.first().and_then(|&l| trie.child(ROOT, l));
        let mut prev: Option<&Run> = None;
        while let Some(c) = next {
            let run = &trie.runs[c];
            trie.prefetch_child(c, locals.get(i + run.len as usize).copied());
            let k = common_prefix(trie.blocks.locals(run.start, run.len), &locals[i..]);
            let to = i + k as usize;
            // Found before crediting this run's members, so its locals load meanwhile.
            next = if k == run.len && to < locals.len() { trie.child(c, locals[to]) } else { None };
            if let Some(n) = next {
                trie.prefetch_locals(n);
            }
            // `prev` is the run this one hangs off: its flag says so when this is its only
            // child; a run with several children compares the lists.
            if prev.is_some_and(|p| p.same_as_child() || p.same_holders(run)) {
                // Held by exactly the holders of the run before (a chain its holders stored
                // in several operations): whoever extended there extends here too.
                *s.ends.last_mut().expect("the run before extended someone") = to as u32;
                (prev, i) = (Some(run), to);
                continue;
            }
            let stage = s.ends.len() as u32;
            let extended = if !BY_SLOT && stage == 0 && f.is_none() {
                s.credit_all(run)
            } else {
                let mut extended = 0usize;
                for m in run.members.iter() {
                    let who = if BY_SLOT { self.holders.leader(m.holder) } else { m.holder };
                    let st = &mut s.stage[who as usize];
                    if *st == stage && (f.is_none() || self.holder_ok(f, m.holder)) {
                        *st = stage + 1;
                        extended += 1;
                        if stage == 0 {
                            s.touched.push(who);
                        }
                    }
                }
                extended
            };
            if extended == 0 {
                break;
            }
            s.ends.push(to as u32);
            s.reached.push(extended as u32);
            if BY_SLOT {
                s.runs.push(c);
            }
            (prev, i) = (Some(run), to);
        }
    }

    /// Every holder covering any position, with its depth and intervals, in no particular order.
    pub(crate) fn match_full(&self, locals: &[u64], f: &Filter) -> Vec<(u32, Acc)> {
        let mut acc: FxHashMap<u32, Acc> = FxHashMap::default();
        let trie = &self.trie;
        let (mut r, mut i) = (ROOT, 0usize);
        while i < locals.len() {
            let Some(c) = trie.child(r, locals[i]) else { break };
            let run = &trie.runs[c];
            let k = common_prefix(trie.blocks.locals(run.start, run.len), &locals[i..]);
            let (from, to) = (i as u32, (i + k as usize) as u32);
            for m in run.members.iter() {
                if !f.is_none() && !self.holder_ok(f, m.holder) {
                    continue;
                }
                acc.entry(m.holder).or_default().credit(from, to);
            }
            if k < run.len {
                break;
            }
            (r, i) = (c, to as usize);
        }
        // Unordered: both callers order what they return (by depth and slot).
        acc.into_iter().collect()
    }
}

/// Per-thread buffers of the depth-only walk.
#[derive(Default)]
pub(crate) struct Scratch {
    /// Per holder slot: how many extending runs it was extended by (0 outside a query); with
    /// `BY_SLOT`, indexed by each slot's leader instead.
    pub stage: Vec<u32>,
    /// Holders with depth >= 1 (with `BY_SLOT`: slot leaders), in the order of the first run's
    /// members: holder key order.
    pub touched: Vec<u32>,
    /// The depth reached at each extending run: stage `s` means depth `ends[s - 1]`.
    pub ends: Vec<u32>,
    /// How many holders each extending run extended: `reached[s - 1]` reached stage `s`.
    reached: Vec<u32>,
    /// The run each stage began at (its members hold the stage's whole stretch: the runs
    /// stepped into without comparing have the same holders).
    pub runs: Vec<u32>,
    /// Per holder slot: where its entry is in the tier path's list of holdings (`u32::MAX`
    /// outside a query).
    pub at: Vec<u32>,
    /// The tier path's holdings of each slot in `order`, by tier code (kept between queries:
    /// hundreds of slots' worth of fresh memory per query cost more than the combining).
    pub slot_accs: Vec<[Acc; 4]>,
    /// Where the next holder of each final stage goes in `order`.
    next: Vec<u32>,
    pub order: Vec<u32>,
}

impl Scratch {
    /// The first run without a filter: every stage is still 0, so every member (members are
    /// distinct) extends to stage 1, with no per-member test. Returns how many.
    fn credit_all(&mut self, run: &Run) -> usize {
        for m in run.members.iter() {
            self.stage[m.holder as usize] = 1;
        }
        self.touched.extend(run.members.iter().map(|m| m.holder));
        run.members.len()
    }

    /// Calls `f(i, holder, depth)` for the touched holders in `order`, resetting each one's
    /// stage for the next query in the same pass (one walk over them instead of two).
    pub(super) fn take_in_order(&mut self, mut f: impl FnMut(usize, u32, u32)) {
        for (i, &h) in self.order.iter().enumerate() {
            let stage = std::mem::take(&mut self.stage[h as usize]);
            f(i, h, self.ends[stage as usize - 1]);
        }
    }

    /// `order`: the touched holders by depth (descending), then holder key. `touched` is
    /// already in key order (runs keep their members sorted by key, and every touched holder
    /// is a member of the first run), and the walk counted how many holders reached each
    /// stage, so one stable pass places them: final stage `s` holds `reached[s-1] - reached[s]`
    /// holders. Most holders usually stop at the first run; they are placed with a register
    /// counter, without the memory increment chain a counting sort has on its busiest bucket.
    pub(super) fn sort_by_depth_then_key(&mut self) {
        self.order.clear();
        let top = self.reached.len();
        if top == 0 {
            return;
        }
        self.next.clear();
        self.next.resize(top + 1, 0);
        let mut at = 0;
        for s in (1..=top).rev() {
            self.next[s] = at;
            at += self.reached[s - 1] - self.reached.get(s).copied().unwrap_or(0);
        }
        self.order.resize(self.touched.len(), 0);
        let mut first = self.next[1];
        for &h in &self.touched {
            let s = self.stage[h as usize] as usize;
            if s == 1 {
                self.order[first as usize] = h;
                first += 1;
            } else {
                self.order[self.next[s] as usize] = h;
                self.next[s] += 1;
            }
        }
    }
}

thread_local! {
    pub(crate) static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

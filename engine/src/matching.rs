//! Longest-prefix matching: walk the query's chain down the trie and credit each holder only
//! for positions it holds, contiguously from position 0.
//!
//! Never overcount: a holder's depth only advances at position `i` if the holder is a member
//! of the node at `i` *and* its depth is already `i`. A holder that holds later blocks but
//! misses an earlier one (an evicted head or a hole in the middle) stops at the hole.

use crate::keyspace::Keyspace;
use crate::trie::{common_prefix, ROOT};
use crate::types::{HolderMatch, MatchOptions};
use rustc_hash::FxHashMap;

#[derive(Default)]
struct Acc {
    depth: u32,
    intervals: Vec<(u32, u32)>,
}

impl Keyspace {
    /// Scores every holder against `locals` (a chain of local hashes from position 0).
    ///
    /// Without `opts.intervals`, only holders with depth ≥ 1 are returned and the walk stops
    /// at the first position no holder still covers contiguously. With it, every holder that
    /// covers any position is returned with its intervals. Results are sorted by depth
    /// (descending), then holder key, and cut to `opts.top_k`.
    pub fn match_chain(&self, locals: &[u64], opts: &MatchOptions) -> Vec<HolderMatch> {
        let sorted;
        let candidates = match opts.candidates.as_deref() {
            Some(c) if !c.is_sorted() => {
                sorted = sorted_copy(c);
                Some(&sorted[..])
            }
            c => c,
        };
        let filter = Filter { lane: opts.lane, candidates, exclude_gapped: opts.exclude_gapped };
        if opts.intervals {
            let mut out = self.match_full(locals, &filter);
            out.sort_unstable_by(|a, b| b.depth.cmp(&a.depth).then(a.holder.cmp(&b.holder)));
            out.truncate(opts.top_k.unwrap_or(usize::MAX));
            return out;
        }
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            self.match_depth(locals, &filter, s);
            s.sort_by_depth_then_key();
            let n = s.order.len().min(opts.top_k.unwrap_or(usize::MAX));
            let out = s.order[..n].iter().map(|&h| self.result(h, s.depth[h as usize], Vec::new())).collect();
            s.reset();
            out
        })
    }

    /// Whether the options let `holder` be reported.
    fn holder_ok(&self, f: &Filter, holder: u32) -> bool {
        let h = self.holders.at(holder);
        f.lane.is_none_or(|l| h.key.lane == l)
            && !(f.exclude_gapped && h.gapped)
            && f.candidates.is_none_or(|c| c.binary_search(&h.key.worker).is_ok())
    }

    fn result(&self, h: u32, depth: u32, intervals: Vec<(u32, u32)>) -> HolderMatch {
        let holder = self.holders.at(h);
        HolderMatch {
            holder: holder.key,
            depth,
            total: holder.blocks,
            inferred: !holder.fed,
            gapped: holder.gapped,
            intervals,
        }
    }

    /// Depth only, with early exit. Per-holder depths live in a dense per-thread array indexed
    /// by holder slot (no hashing on the hot path); the caller reads and resets touched slots.
    ///
    /// The walk goes run by run: the query's locals are compared with the run's as one slice,
    /// and the run's members are credited once for the whole matched stretch.
    fn match_depth(&self, locals: &[u64], f: &Filter, s: &mut Scratch) {
        if s.depth.len() < self.holders.slots.len() {
            s.depth.resize(self.holders.slots.len(), 0);
        }
        s.touched.clear();
        s.ends.clear();
        let trie = &self.trie;
        let (mut r, mut i) = (ROOT, 0usize);
        while i < locals.len() {
            let Some(c) = trie.child(r, locals[i]) else { break };
            let run = &trie.runs[c];
            let k = common_prefix(trie.blocks.locals(run.start, run.len), &locals[i..]);
            let (from, to) = (i as u32, (i + k as usize) as u32);
            let mut extended = 0usize;
            for m in run.members.iter() {
                let d = &mut s.depth[m.holder as usize];
                if *d == from && (f.is_none() || self.holder_ok(f, m.holder)) {
                    *d = to;
                    extended += 1;
                    if from == 0 {
                        s.touched.push(m.holder);
                    }
                }
            }
            if extended == 0 {
                break;
            }
            s.ends.push(to);
            if k < run.len {
                break;
            }
            (r, i) = (c, to as usize);
        }
    }

    /// Every holder covering any position, with its intervals.
    fn match_full(&self, locals: &[u64], f: &Filter) -> Vec<HolderMatch> {
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
                let a = acc.entry(m.holder).or_default();
                if a.depth == from {
                    a.depth = to;
                }
                match a.intervals.last_mut() {
                    Some(last) if last.1 == from => last.1 = to,
                    _ => a.intervals.push((from, to)),
                }
            }
            if k < run.len {
                break;
            }
            (r, i) = (c, to as usize);
        }
        acc.into_iter().map(|(h, a)| self.result(h, a.depth, a.intervals)).collect()
    }
}

/// The holder filters of [`MatchOptions`], with the candidate list sorted.
struct Filter<'a> {
    lane: Option<u32>,
    candidates: Option<&'a [u64]>,
    exclude_gapped: bool,
}

impl Filter<'_> {
    /// No filter: the hot loop skips the holder lookup.
    #[inline]
    fn is_none(&self) -> bool {
        self.lane.is_none() && self.candidates.is_none() && !self.exclude_gapped
    }
}

fn sorted_copy(c: &[u64]) -> Vec<u64> {
    let mut v = c.to_vec();
    v.sort_unstable();
    v
}

/// Per-thread buffers of the depth-only walk.
#[derive(Default)]
struct Scratch {
    /// Matched depth per holder slot (0 outside a query).
    depth: Vec<u32>,
    /// Holders with depth >= 1, in the order of the first run's members: holder key order.
    touched: Vec<u32>,
    /// The depths reached, one per run that extended someone: increasing.
    ends: Vec<u32>,
    count: Vec<u32>,
    order: Vec<u32>,
}

impl Scratch {
    /// `order`: the touched holders by depth (descending), then holder key: a stable counting sort
    /// over the few distinct depths, since `touched` is already in key order (runs keep
    /// their members sorted by key, and every touched holder is a member of the first run).
    fn sort_by_depth_then_key(&mut self) {
        let stage = |ends: &[u32], d: u32| ends.binary_search(&d).expect("a depth is a run end");
        self.count.clear();
        self.count.resize(self.ends.len(), 0);
        for &h in &self.touched {
            self.count[stage(&self.ends, self.depth[h as usize])] += 1;
        }
        let mut next = 0;
        for c in self.count.iter_mut().rev() {
            (*c, next) = (next, next + *c);
        }
        self.order.clear();
        self.order.resize(self.touched.len(), 0);
        for &h in &self.touched {
            let slot = &mut self.count[stage(&self.ends, self.depth[h as usize])];
            self.order[*slot as usize] = h;
            *slot += 1;
        }
    }

    fn reset(&mut self) {
        for &h in &self.touched {
            self.depth[h as usize] = 0;
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

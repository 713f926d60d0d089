//! Longest-prefix matching: walk the query's chain down the trie and credit each holder only
//! for positions it holds, contiguously from position 0.
//!
//! Never overcount: a holder's depth only advances at position `i` if the holder is a member
//! of the node at `i` *and* its depth is already `i`. A holder that holds later blocks but
//! misses an earlier one (an evicted head or a hole in the middle) stops at the hole.

use crate::keyspace::Keyspace;
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
            // Sort small keys, not the results: (depth descending, holder key) is the order.
            let mut keys = std::mem::take(&mut s.keys);
            keys.clear();
            keys.extend(s.touched.iter().map(|&h| {
                let k = self.holders.at(h).key;
                let d = std::mem::take(&mut s.depth[h as usize]);
                (u32::MAX - d, k.worker, (u64::from(k.dp_rank) << 32) | u64::from(k.lane), h, d)
            }));
            keys.sort_unstable();
            keys.truncate(opts.top_k.unwrap_or(usize::MAX));
            let out = keys.iter().map(|&(_, _, _, h, d)| self.result(h, d, Vec::new())).collect();
            s.keys = keys;
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
    fn match_depth(&self, locals: &[u64], f: &Filter, s: &mut Scratch) {
        if s.depth.len() < self.holders.slots.len() {
            s.depth.resize(self.holders.slots.len(), 0);
        }
        s.touched.clear();
        let mut cur = crate::trie::ROOT;
        for (i, &local) in locals.iter().enumerate() {
            let i = i as u32;
            let Some(child) = self.arena.child(cur, local) else { break };
            cur = child;
            let mut extended = 0usize;
            for m in self.arena.nodes[child as usize].members.iter() {
                let d = &mut s.depth[m.holder as usize];
                if *d == i && (f.is_none() || self.holder_ok(f, m.holder)) {
                    *d = i + 1;
                    extended += 1;
                    if i == 0 {
                        s.touched.push(m.holder);
                    }
                }
            }
            if extended == 0 {
                break;
            }
        }
    }

    /// Every holder covering any position, with its intervals.
    fn match_full(&self, locals: &[u64], f: &Filter) -> Vec<HolderMatch> {
        let mut acc: FxHashMap<u32, Acc> = FxHashMap::default();
        let mut cur = crate::trie::ROOT;
        for (i, &local) in locals.iter().enumerate() {
            let i = i as u32;
            let Some(child) = self.arena.child(cur, local) else { break };
            cur = child;
            for m in self.arena.nodes[child as usize].members.iter() {
                if !f.is_none() && !self.holder_ok(f, m.holder) {
                    continue;
                }
                let a = acc.entry(m.holder).or_default();
                if a.depth == i {
                    a.depth = i + 1;
                }
                match a.intervals.last_mut() {
                    Some(last) if last.1 == i => last.1 = i + 1,
                    _ => a.intervals.push((i, i + 1)),
                }
            }
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

#[derive(Default)]
struct Scratch {
    depth: Vec<u32>,
    touched: Vec<u32>,
    keys: Vec<(u32, u64, u64, u32, u32)>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

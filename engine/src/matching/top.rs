//! The `top_k` best holders without visiting every holder: cost grows with the query's path
//! and with k, not with how many holders share its first runs.
//!
//! The answer's order is depth (descending), then key. A holder's depth is the end of the last
//! *stage* (a run whose holders differ from the run before's, with the runs after it that have
//! the same holders) it is a member of, contiguously from the first. So the walk first finds
//! the stages of the query's path, without crediting anyone ([`Keyspace::path_stages`]), then
//! takes holders from the deepest stage up: a member of stage `j` is at depth `end[j]` exactly
//! when it is a member of every stage before `j` (checked by binary search of their member
//! lists, which are sorted by key) and not of stage `j + 1`. Members of a stage are met in key
//! order, so the holders come out in the answer's order, and the walk stops at the k-th.
//!
//! Where the deepest stages hold many members that are not contiguous (holes, evicted heads),
//! those checks could cost more than crediting everyone: the walk counts its work and gives
//! up past what the one-pass walk (`walk`) would have cost, which then answers.
//!
//! The tier path takes the same walk per slot: a slot is a member of a stage if any of its
//! counted holders is, and the k best slots' holders are then credited with their stretches
//! and combined as in `tiers` (only without tier weights, which order by score first).

use crate::keyspace::Keyspace;
use crate::matching::tiers::{combine, Holding};
use crate::matching::walk::{Acc, Filter};
use crate::trie::{common_prefix, Run, ROOT};
use crate::types::{HolderKey, HolderMatch, MatchOptions, Tier};
use smallvec::SmallVec;

/// Member lists up to this long are scanned by holder index instead of binary-searched by key.
const SCAN_MEMBERS: usize = 16;

/// Where the top-k walk stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cut {
    /// After the first `k` holders.
    First(usize),
    /// After every holder at the best depth (all the ties, however many).
    BestDepth,
}

/// One stage of a query's path: its first run and the depth its stretch reaches.
#[derive(Clone, Copy)]
pub(crate) struct Stage {
    run: u32,
    end: u32,
}

/// Per-thread buffers of the top-k walk.
#[derive(Default)]
pub(crate) struct TopScratch {
    stages: Vec<Stage>,
    /// The holders (or slot leaders) found so far, with their depths, best first.
    pub found: Vec<(u32, u32)>,
}

thread_local! {
    pub(crate) static TOP: std::cell::RefCell<TopScratch> = std::cell::RefCell::new(TopScratch::default());
}

impl Keyspace {
    /// The stages of the query's path into `stages`; returns how many memberships they list
    /// (what crediting every member would visit). Stops at a run without members: nobody is
    /// contiguous past it.
    fn path_stages(&self, locals: &[u64], stages: &mut Vec<Stage>) -> usize {
        stages.clear();
        let trie = &self.trie;
        let mut i = 0usize;
        let mut next = locals.first().and_then(|&l| trie.child(ROOT, l));
        let mut prev: Option<&Run> = None;
        let mut members = 0;
        while let Some(c) = next {
            let run = &trie.runs[c];
            trie.prefetch_child(c, locals.get(i + run.len as usize).copied());
            let k = common_prefix(trie.blocks.locals(run.start, run.len), &locals[i..]);
            let to = i + k as usize;
            next = if k == run.len && to < locals.len() { trie.child(c, locals[to]) } else { None };
            if let Some(n) = next {
                trie.prefetch_locals(n);
            }
            if prev.is_some_and(|p| p.same_as_child() || p.same_holders(run)) {
                stages.last_mut().expect("a stage before").end = to as u32;
            } else {
                if run.members.is_empty() {
                    break;
                }
                members += run.members.len();
                stages.push(Stage { run: c, end: to as u32 });
            }
            (prev, i) = (Some(run), to);
        }
        members
    }

    /// Whether holder `h` (whose key is `key`) is a member of `run`.
    #[inline]
    fn is_member(&self, run: &Run, h: u32, key: &HolderKey) -> bool {
        let m = &run.members;
        if m.len() <= SCAN_MEMBERS {
            return m.iter().any(|x| x.holder == h);
        }
        m.binary_search_by(|x| self.holders.card(x.holder).key().cmp(key)).is_ok()
    }

    /// The holders of `leader`'s slot that count (on a counted tier, passing `f`), with keys.
    fn counted(&self, leader: u32, f: &Filter) -> SmallVec<[(u32, HolderKey); 4]> {
        let tiers = f.tiers.expect("the tier path counts tiers");
        tiers
            .iter()
            .filter_map(|&t| self.holders.on_tier(leader, t))
            .filter(|&h| self.holder_ok(f, h))
            .map(|h| (h, self.holders.card(h).key()))
            .collect()
    }

    /// Whether one of a slot's counted holders is among `run`'s members.
    fn slot_is_member(&self, run: &Run, counted: &[(u32, HolderKey)]) -> bool {
        counted.iter().any(|(h, key)| self.is_member(run, *h, key))
    }

    /// The best holders (with `BY_SLOT`: slot leaders) as `cut` says, and their depths, into
    /// `s.found`, best first. `false` if the walk gave up (see the module doc): `s.found` is
    /// then meaningless and the one-pass walk must answer.
    pub(crate) fn match_top<const BY_SLOT: bool>(
        &self,
        locals: &[u64],
        f: &Filter,
        cut: Cut,
        s: &mut TopScratch,
    ) -> bool {
        s.found.clear();
        // The one-pass walk visits every membership, then sorts and lists every holder.
        let budget = 2 * self.path_stages(locals, &mut s.stages) + 64;
        let mut work = 0usize;
        let stages = &s.stages;
        let runs = &self.trie.runs;
        for (j, stage) in stages.iter().enumerate().rev() {
            let run = &runs[stage.run];
            let deeper = stages.get(j + 1).map(|d| &runs[d.run]);
            for m in run.members.iter() {
                work += j + 2;
                if work > budget {
                    return false;
                }
                let found = if BY_SLOT {
                    let leader = self.holders.leader(m.holder);
                    // A slot's holders are neighbours in key order: met again, skip.
                    if s.found.last().is_some_and(|&(l, _)| l == leader) || !self.holder_ok(f, m.holder) {
                        continue;
                    }
                    let counted = self.counted(leader, f);
                    if deeper.is_some_and(|d| self.slot_is_member(d, &counted))
                        || !stages[..j].iter().rev().all(|e| self.slot_is_member(&runs[e.run], &counted))
                    {
                        continue;
                    }
                    leader
                } else {
                    if !f.is_none() && !self.holder_ok(f, m.holder) {
                        continue;
                    }
                    let key = self.holders.card(m.holder).key();
                    if deeper.is_some_and(|d| self.is_member(d, m.holder, &key))
                        || !stages[..j].iter().rev().all(|e| self.is_member(&runs[e.run], m.holder, &key))
                    {
                        continue;
                    }
                    m.holder
                };
                s.found.push((found, stage.end));
                if cut == Cut::First(s.found.len()) {
                    return true;
                }
            }
            // Every holder at a stage's depth is a member of that stage: the first stage that
            // found anyone found every holder at the best depth.
            if cut == Cut::BestDepth && !s.found.is_empty() {
                return true;
            }
        }
        true
    }

    /// The answers of the found slots into `out`, best first: each slot's counted holders in
    /// preference order, credited with every stage up to the slot's depth they are members of
    /// (what the all-slots tier path gives those slots), combined.
    pub(crate) fn top_slots_into(
        &self,
        opts: &MatchOptions,
        f: &Filter,
        s: &TopScratch,
        out: &mut Vec<HolderMatch>,
    ) {
        let order = opts.tier_order();
        let mut held: SmallVec<[Holding; 4]> = SmallVec::new();
        for &(leader, depth) in &s.found {
            held.clear();
            for (rank, &tier) in order.iter().enumerate() {
                let Some(h) = self.holders.on_tier(leader, tier) else { continue };
                if !self.holder_ok(f, h) {
                    continue;
                }
                let card = self.holders.card(h);
                let key = card.key();
                let mut acc = Acc::default();
                let mut from = 0;
                for stage in s.stages.iter().take_while(|e| e.end <= depth) {
                    if self.is_member(&self.trie.runs[stage.run], h, &key) {
                        acc.credit(from, stage.end);
                    }
                    from = stage.end;
                }
                held.push(Holding {
                    tier,
                    rank,
                    acc,
                    blocks: card.blocks,
                    fed: card.fed,
                    gapped: card.gapped,
                });
            }
            let slot = self.holders.card(leader).key().on(Tier::Gpu);
            out.extend(combine(slot, &held, opts));
        }
    }
}

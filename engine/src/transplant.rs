//! Replacing one partition's holders with another keyspace's (anti-entropy repair).
//!
//! Holders of different partitions share trie nodes but never state, so a partition's holders
//! can be rebuilt elsewhere (checkpoint + replay of that partition) and moved in: drop ours,
//! then recreate theirs node by node (by path), with the same stamps, records and ext
//! resolution, so the result digests, answers and evolves as if it had been applied here.

use crate::digest::block_term;
use crate::holder::{Holder, Record};
use crate::keyspace::Keyspace;
use crate::trie::{Member, ROOT};
use rustc_hash::FxHashMap;

impl Keyspace {
    /// Replaces every holder of partition `group` with `src`'s holders of that partition.
    pub fn replace_group(&mut self, group: u32, src: &Keyspace) {
        for h in self.holders.sorted() {
            if self.holders.at(h).group == group {
                let snap = self.snap_term(h);
                self.clear_holder(h);
                self.settle_term(h, snap);
                self.holders.remove(h);
            }
        }
        let theirs: Vec<u32> =
            src.holders.sorted().into_iter().filter(|&h| src.holders.at(h).group == group).collect();
        if theirs.is_empty() {
            return;
        }
        let mut members: FxHashMap<u32, Vec<(u32, u32)>> = FxHashMap::default();
        for (i, n) in src.arena.nodes.iter().enumerate().skip(1) {
            if n.live() {
                for m in n.members.iter() {
                    if src.holders.at(m.holder).group == group {
                        members.entry(m.holder).or_default().push((i as u32, m.stamp));
                    }
                }
            }
        }
        let mut map: FxHashMap<u32, u32> = FxHashMap::default();
        map.insert(ROOT, ROOT);
        for sh in theirs {
            let s = src.holders.at(sh);
            let mut h = Holder::new(s.key, s.group);
            h.fed = s.fed;
            h.gapped = s.gapped;
            h.next_stamp = s.next_stamp;
            h.last_time = s.last_time;
            let hi = self.holders.insert(h);
            let snap = self.snap_term(hi);
            for &(n, stamp) in members.get(&sh).map(Vec::as_slice).unwrap_or(&[]) {
                let d = self.map_node(src, n, &mut map);
                let node = &mut self.arena.nodes[d as usize];
                node.members.push(Member { holder: hi, stamp });
                let path = node.path;
                let holder = self.holders.at_mut(hi);
                holder.blocks += 1;
                holder.digest = holder.digest.wrapping_add(block_term(path, !holder.fed));
                // The ext this holder resolves to the node in `src` must resolve here too.
                let sn = &src.arena.nodes[n as usize];
                let ext = s.override_of.get(&n).copied().or(sn.has_ext().then_some(sn.ext));
                if let Some(e) = ext {
                    if !self.arena.bind_ext(d, e) {
                        let holder = self.holders.at_mut(hi);
                        holder.overrides.insert(e, d);
                        holder.override_of.insert(d, e);
                    }
                }
            }
            for r in &s.records {
                let leaf = self.map_node(src, r.leaf, &mut map);
                self.arena.nodes[leaf as usize].pins += 1;
                self.holders.at_mut(hi).records.push_back(Record { leaf, ..*r });
            }
            self.settle_term(hi, snap);
        }
    }

    /// The node here with the same path as `src`'s node `n`, created if needed.
    fn map_node(&mut self, src: &Keyspace, n: u32, map: &mut FxHashMap<u32, u32>) -> u32 {
        if let Some(&d) = map.get(&n) {
            return d;
        }
        let mut chain = Vec::new();
        let mut cur = n;
        while !map.contains_key(&cur) {
            chain.push(cur);
            cur = src.arena.nodes[cur as usize].parent;
        }
        let mut d = map[&cur];
        for &c in chain.iter().rev() {
            d = self.arena.child_or_insert(d, src.arena.nodes[c as usize].local);
            map.insert(c, d);
        }
        d
    }
}

//! Holder membership of runs, and the operation records that own it.
//!
//! Every store or placement takes a per-holder stamp; the blocks it touches carry it and a
//! record remembers the operation's window (its last block and length). A block belongs to
//! exactly one record, the one whose stamp it carries, and every block a holder holds in one
//! run carries the same stamp, so a record's window always covers whole runs of its stamp:
//! evicting, compacting and renumbering work run by run, without splitting. Only a write that
//! covers part of a run (a store over a shared prefix, a removal of one block) splits it.
//!
//! A run's members are kept sorted by holder key, so a match lists holders in key order
//! without sorting them (see `crate::matching`).

use crate::keyspace::holders::Record;
use crate::keyspace::Keyspace;
use crate::trie::{Member, Segment};

/// Member lists up to this long are searched front to back: over 512 contiguous bytes a scan
/// is as fast as a binary search that looks up each probed member's card (`engine-bench` at
/// 256 and 2,048 workers measured no difference from the scan alone). A longer list is
/// searched by key, which trusts its order: a list left unsorted by damage (a dangling member
/// whose slot a holder of another key took) could hide a member from the search, as it
/// already could from a match; the scrub reports such a list (`check::scrub`).
const SCANNED_MEMBERS: usize = 64;

/// Lookups that took the keyed path: tests assert theirs reach it.
#[cfg(any(test, feature = "testing"))]
pub(crate) static KEYED_LOOKUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Keyspace {
    /// Where holder `h` is among run `r`'s members. Members are in strictly increasing holder
    /// key order (`check::invariants` verifies it), so a long list is searched by key: a
    /// system prompt a whole fleet holds has a member per worker (tens of thousands in
    /// `bench-scale`), and every store under it looks its holder up there.
    #[inline]
    pub(crate) fn member_pos(&self, r: u32, h: u32) -> Option<usize> {
        let members = &self.trie.runs[r].members;
        if members.len() <= SCANNED_MEMBERS {
            return members.iter().position(|m| m.holder == h);
        }
        #[cfg(any(test, feature = "testing"))]
        KEYED_LOOKUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let found = self.member_slot(r, h).ok();
        debug_assert_eq!(found, members.iter().position(|m| m.holder == h), "members in key order");
        found
    }

    /// Where holder `h` is among run `r`'s members (`Ok`), or where it would go in key order
    /// (`Err`): one binary search by key (a short list is scanned first, as in
    /// [`Self::member_pos`]).
    #[inline]
    fn member_slot(&self, r: u32, h: u32) -> Result<usize, usize> {
        let members = &self.trie.runs[r].members;
        if members.len() <= SCANNED_MEMBERS {
            if let Some(pos) = members.iter().position(|m| m.holder == h) {
                return Ok(pos);
            }
        }
        let key = self.holders.card(h).key();
        let at = members.partition_point(|m| self.holders.card(m.holder).key() < key);
        match members.get(at) {
            Some(m) if m.holder == h => Ok(at),
            _ => Err(at),
        }
    }

    /// Whether holder `h` holds run `r` with `stamp`.
    #[inline]
    pub(crate) fn holds_with(&self, r: u32, h: u32, stamp: u32) -> bool {
        self.member_pos(r, h).is_some_and(|pos| self.trie.runs[r].members[pos].stamp == stamp)
    }

    /// Adds (or restamps) the holder's membership of `count` blocks from `first` (inside one
    /// run), splitting the run so the stretch is a run of its own. Returns the blocks that
    /// are new to the holder. `known_terms`: the stretch's digest terms, when its walk just
    /// created it (then nobody holds it yet).
    pub(crate) fn add_member_stretch(
        &mut self,
        h: u32,
        first: u32,
        count: u32,
        stamp: u32,
        known_terms: Option<u64>,
    ) -> u32 {
        debug_assert!(stamp < self.holders.at(h).next_stamp, "a stamp is taken before it is used");
        self.trie.split_before(first);
        if self.trie.runs[self.trie.run_of(first)].len > count {
            self.trie.split_before(first + count);
        }
        let r = self.trie.run_of(first);
        debug_assert_eq!((self.trie.runs[r].start, self.trie.runs[r].len), (first, count));
        let at = match self.member_slot(r, h) {
            Ok(pos) => {
                self.trie.runs[r].members[pos].stamp = stamp;
                return 0;
            }
            Err(at) => at,
        };
        debug_assert!(self.trie.runs[r].members.iter().all(|m| m.holder != h), "members in key order");
        self.trie.runs[r].members.insert(at, Member { holder: h, stamp });
        self.trie.holders_changed(r);
        let inferred = !self.holders.at(h).fed;
        let terms = known_terms.unwrap_or_else(|| self.trie.terms(r, 0, count, inferred));
        let holder = self.holders.at_mut(h);
        holder.blocks += count;
        holder.digest = holder.digest.wrapping_add(terms);
        count
    }

    /// Takes the holder off every block of run `r` (it must be a member). Returns the stamp it
    /// held them with.
    pub(crate) fn remove_member_run(&mut self, h: u32, r: u32) -> u32 {
        let pos = self.member_pos(r, h).expect("the holder is a member of the run");
        let run = &mut self.trie.runs[r];
        let stamp = run.members.remove(pos).stamp;
        let (start, len) = (run.start, run.len);
        self.trie.holders_changed(r);
        let inferred = !self.holders.at(h).fed;
        let terms = self.trie.terms(r, 0, len, inferred);
        let holder = self.holders.at_mut(h);
        debug_assert!(holder.blocks >= len, "a member run is counted in the holder's blocks");
        holder.blocks -= len;
        holder.digest = holder.digest.wrapping_sub(terms);
        if !holder.override_of.is_empty() {
            for b in start..start + len {
                if let Some(e) = holder.override_of.remove(&b) {
                    holder.overrides.remove(&e);
                }
            }
        }
        stamp
    }

    /// Takes the holder off block `b` and off the blocks before it in its run that `exts`
    /// (which names `b` first) goes on naming, tail first, as engines evict. Returns how many
    /// (at least 1). In place when the holder is the run's only one ([`Self::remove_tail`]),
    /// else as one stretch split out of the run ([`Self::remove_stretch`]).
    /// `hashes[k]` is `ext_hash(exts[k])`.
    pub(crate) fn remove_named(&mut self, h: u32, b: u32, exts: &[u64], hashes: &[u64]) -> u32 {
        match self.remove_tail(h, b, exts, hashes) {
            0 => {
                let n = self.named_before(h, b, exts);
                self.remove_stretch(h, b + 1 - n, n);
                n
            }
            n => n,
        }
    }

    /// How many blocks from `b` backwards inside its run `exts` names in turn (`exts[0]` names
    /// `b`), each by its canonical ext. Only `b` when the holder has overrides: its exts then
    /// need not be the canonical ones.
    fn named_before(&self, h: u32, b: u32, exts: &[u64]) -> u32 {
        if !self.holders.at(h).overrides.is_empty() {
            return 1;
        }
        let start = self.trie.runs[self.trie.run_of(b)].start;
        let mut n = 1;
        while (n as usize) < exts.len()
            && b - n >= start
            && self.trie.blocks.meta(b - n).ext() == Some(exts[n as usize])
        {
            n += 1;
        }
        n
    }

    /// Takes the holder off one block it holds (see [`Self::remove_stretch`]).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn remove_block(&mut self, h: u32, b: u32) {
        self.remove_stretch(h, b, 1);
    }

    /// Takes the holder off `count` blocks from `first`, inside one run it is a member of. A
    /// record ending at the last of them shrinks to its deepest block still owned (engines
    /// evict tail-first, so records shrink and vanish as their blocks go, and do not keep dead
    /// blocks pinned). The stretch is split out into a run of its own first, once for the
    /// whole stretch: a block at a time, evicting a prefix that others share cut it into
    /// runs of one block each, and every cut copied the run's member list.
    fn remove_stretch(&mut self, h: u32, first: u32, count: u32) {
        let last = first + count - 1;
        let r = self.trie.run_of(last);
        let Some(pos) = self.member_pos(r, h) else { return };
        debug_assert!(first >= self.trie.runs[r].start, "the stretch lies inside one run");
        let stamp = self.trie.runs[r].members[pos].stamp;
        let ends_here = self.record_ending_at(h, stamp, last);
        self.trie.split_before(first);
        if self.trie.runs[self.trie.run_of(first)].len > count {
            self.trie.split_before(last + 1);
        }
        let r = self.trie.run_of(first);
        self.remove_member_run(h, r);
        if let Some(ri) = ends_here {
            self.shrink_record(h, ri);
        }
        self.trie.release(r);
    }

    /// The common case of removals, in place: block `b` is the last block of a run that only
    /// this holder holds, and `exts` (which names `b` first) goes on naming the blocks before
    /// it, tail first, as engines evict. Drops as many of them as it can while the run keeps
    /// its first block (the run and its records stay; nothing is split), and returns how many
    /// (0 when the case does not apply). The record ending at `b` then ends earlier in the
    /// same run, so its pin stays.
    /// `hashes[k]` is `ext_hash(exts[k])`.
    pub(crate) fn remove_tail(&mut self, h: u32, b: u32, exts: &[u64], hashes: &[u64]) -> u32 {
        let r = self.trie.run_of(b);
        let Some(pos) = self.member_pos(r, h) else { return 0 };
        let run = &self.trie.runs[r];
        let ends_here = self.record_ending_at(h, run.members[pos].stamp, b);
        let sole = run.members.len() == 1 && run.children() == 0;
        if b != run.last() || b == run.start || !sole || run.pins != u32::from(ends_here.is_some()) {
            return 0;
        }
        // Blocks resolve by canonical ext only without overrides: then only `b` is sure.
        let exts = if self.holders.at(h).overrides.is_empty() { exts } else { &exts[..1] };
        let keep = run.start + 1;
        let mut n = 1;
        while (n as usize) < exts.len()
            && b - n >= keep
            && self.trie.blocks.meta(b - n).ext() == Some(exts[n as usize])
        {
            n += 1;
        }
        let inferred = !self.holders.at(h).fed;
        let terms = self.trie.shrink_tail(r, n, inferred, hashes);
        let holder = self.holders.at_mut(h);
        holder.blocks -= n;
        holder.digest = holder.digest.wrapping_sub(terms);
        if !holder.override_of.is_empty() {
            if let Some(e) = holder.override_of.remove(&b) {
                holder.overrides.remove(&e);
            }
        }
        if let Some(ri) = ends_here {
            let rec = &mut holder.records[ri];
            // The blocks left in the run carry the same stamp, so they lie in the window.
            debug_assert!(rec.len > n, "every block lies in the window of its record");
            rec.leaf = b - n;
            rec.len -= n;
        }
        n
    }

    /// The index of the holder's record with `stamp`, if its window ends at block `b`.
    fn record_ending_at(&self, h: u32, stamp: u32, b: u32) -> Option<usize> {
        let records = &self.holders.at(h).records;
        let ri = records.binary_search_by_key(&stamp, |r| r.stamp).ok()?;
        (records[ri].leaf == b).then_some(ri)
    }

    /// Record `ri`'s leaf lost its block: the record now ends at the deepest block of its
    /// window the holder still owns with its stamp (always a run end, since a whole run
    /// carries one stamp), or goes if there is none. Moves the pin accordingly.
    fn shrink_record(&mut self, h: u32, ri: usize) {
        let rec = self.holders.at(h).records[ri];
        let leaf_run = self.trie.run_of(rec.leaf);
        self.unpin(leaf_run);
        let (mut cur, mut above) = (rec.leaf, rec.len - 1);
        let found = loop {
            if above == 0 {
                break None;
            }
            cur = self.trie.parent_block(cur);
            above -= 1;
            let r = self.trie.run_of(cur);
            if self.holds_with(r, h, rec.stamp) {
                break Some(cur);
            }
            let skip = (cur - self.trie.runs[r].start).min(above);
            cur -= skip;
            above -= skip;
        };
        let holder = self.holders.at_mut(h);
        match found {
            Some(leaf) => {
                holder.records[ri] = Record { leaf, len: above + 1, ..rec };
                let r = self.trie.run_of(leaf);
                debug_assert_eq!(self.trie.runs[r].last(), leaf, "records end at run ends");
                self.trie.runs[r].pins += 1;
            }
            None => drop(holder.records.remove(ri)),
        }
    }

    fn unpin(&mut self, r: u32) {
        debug_assert!(self.trie.runs[r].pins > 0, "a record's leaf run is pinned by it");
        self.trie.runs[r].pins -= 1;
    }

    /// Appends a record and pins its leaf (the last block of a run).
    pub(crate) fn push_record(&mut self, h: u32, rec: Record) {
        let r = self.trie.run_of(rec.leaf);
        debug_assert_eq!(self.trie.runs[r].last(), rec.leaf, "records end at run ends");
        debug_assert!(rec.len >= 1);
        debug_assert!(
            self.holders.at(h).records.back().is_none_or(|p| p.stamp < rec.stamp),
            "records are in increasing stamp order (eviction and renumbering rely on it)"
        );
        self.trie.runs[r].pins += 1;
        self.holders.at_mut(h).records.push_back(rec);
        if !self.holders.at(h).fed {
            self.holders.queue(h, rec.time);
        }
    }

    /// Removes the holder's blocks that still carry `rec`'s stamp (whole runs) and unpins and
    /// releases its leaf. `rec` is already out of the holder's record list.
    pub(crate) fn evict_record(&mut self, h: u32, rec: Record) -> u32 {
        let mut win = std::mem::take(&mut self.window);
        self.trie.window(rec.leaf, rec.len, &mut win);
        let mut n = 0;
        for &(r, _, count) in &win {
            if self.holds_with(r, h, rec.stamp) {
                debug_assert_eq!(count, self.trie.runs[r].len, "a record's window covers its runs whole");
                self.remove_member_run(h, r);
                n += count;
            }
        }
        let leaf_run = self.trie.run_of(rec.leaf);
        self.unpin(leaf_run);
        self.trie.release(leaf_run);
        // Runs the holder left may now be one run with a neighbour. By block, not by run id:
        // a merge frees one of the two ids.
        for &(_, first, _) in &win {
            if self.trie.blocks.meta(first).run() != crate::trie::blocks::FREE {
                self.trie.merge_around(self.trie.run_of(first));
            }
        }
        self.window = win;
        n
    }

    /// Whether any block of `rec`'s window still carries its stamp for the holder.
    fn record_owns(&self, h: u32, rec: &Record, win: &mut Vec<Segment>) -> bool {
        self.trie.window(rec.leaf, rec.len, win);
        win.iter().any(|&(r, _, _)| self.holds_with(r, h, rec.stamp))
    }

    pub(crate) fn maybe_compact(&mut self, h: u32) {
        let holder = self.holders.at(h);
        if holder.records.len() > 2 * holder.blocks as usize + 16 {
            self.compact(h);
        }
    }

    /// Drops records that no longer own any block.
    pub(crate) fn compact(&mut self, h: u32) {
        let records = std::mem::take(&mut self.holders.at_mut(h).records);
        let mut keep = std::collections::VecDeque::with_capacity(records.len());
        let mut win = std::mem::take(&mut self.window);
        for rec in records {
            if self.record_owns(h, &rec, &mut win) {
                keep.push_back(rec);
            } else {
                let r = self.trie.run_of(rec.leaf);
                self.unpin(r);
                self.trie.release(r);
            }
        }
        self.window = win;
        self.holders.at_mut(h).records = keep;
    }

    /// Reassigns stamps 1..=n to the holder's records in order. Records are in increasing stamp
    /// order, so a new stamp never collides with an old one not yet renamed.
    pub(crate) fn renumber(&mut self, h: u32) {
        self.compact(h);
        let mut records: Vec<Record> = self.holders.at(h).records.iter().copied().collect();
        let mut win = std::mem::take(&mut self.window);
        for (i, rec) in records.iter_mut().enumerate() {
            let new = i as u32 + 1;
            self.trie.window(rec.leaf, rec.len, &mut win);
            for &(r, _, _) in &win {
                for m in self.trie.runs[r].members.iter_mut() {
                    if m.holder == h && m.stamp == rec.stamp {
                        m.stamp = new;
                    }
                }
            }
            rec.stamp = new;
        }
        self.window = win;
        let holder = self.holders.at_mut(h);
        holder.next_stamp = records.len() as u32 + 1;
        holder.records = records.into();
        debug_assert!(
            holder.records.iter().enumerate().all(|(i, r)| r.stamp == i as u32 + 1),
            "renumbered stamps are 1..=n in record order"
        );
    }

    pub(crate) fn take_stamp(&mut self, h: u32) -> u32 {
        if self.holders.at(h).next_stamp >= self.cfg.stamp_limit {
            self.renumber(h);
        }
        let holder = self.holders.at_mut(h);
        let s = holder.next_stamp;
        holder.next_stamp += 1;
        s
    }

    /// Drops every block of the holder, record by record.
    pub(crate) fn clear_blocks(&mut self, h: u32) -> u32 {
        let mut n = 0;
        while let Some(rec) = self.holders.at_mut(h).records.pop_front() {
            n += self.evict_record(h, rec);
        }
        let holder = self.holders.at_mut(h);
        debug_assert_eq!(holder.blocks, 0, "every block belongs to a record");
        holder.overrides.clear();
        holder.override_of.clear();
        n
    }
}

#[cfg(test)]
mod tests {
    use crate::keyspace::Keyspace;
    use crate::types::{BlockHashes, EngineConfig, HolderKey, KeyspaceId};

    /// `n` blocks of one chain, the same for every holder.
    fn chain(n: u64) -> Vec<BlockHashes> {
        (1..=n).map(|i| (1000 + i, i)).map(BlockHashes::from).collect()
    }

    /// Holders that evict a prefix others share, tail first in one removal each, take it out
    /// as one stretch, and the pieces they leave merge back: the trie ends as one run per
    /// distinct member list, not one run per evicted block.
    #[test]
    fn evicting_a_shared_chain_leaves_maximal_runs() {
        let mut ks = Keyspace::new(KeyspaceId::new("t", 64, 1), EngineConfig::default());
        let blocks = chain(64);
        for w in 0..8 {
            ks.store(HolderKey::new(w, 0, 0), None, &blocks, w).expect("stored");
        }
        assert_eq!(ks.trie.live_runs(), 1);
        // Worker 0 evicts the last 24 blocks: the chain splits where its blocks end.
        let tail: Vec<u64> = blocks[40..].iter().rev().map(|b| b.ext).collect();
        assert_eq!(ks.remove(HolderKey::new(0, 0, 0), &tail, 10), (24, 0));
        assert_eq!(ks.trie.live_runs(), 2);
        // The others evict all of it, one after another.
        let all: Vec<u64> = blocks.iter().rev().map(|b| b.ext).collect();
        for w in 1..7 {
            assert_eq!(ks.remove(HolderKey::new(w, 0, 0), &all, 11 + w), (64, 0));
            ks.check_invariants().expect("invariants");
        }
        assert_eq!(ks.trie.live_runs(), 2, "{{0, 7}} on 40 blocks, {{7}} on 24");
        assert_eq!(ks.remove(HolderKey::new(0, 0, 0), &all[24..], 20), (40, 0));
        assert_eq!(ks.trie.live_runs(), 1, "worker 7 alone: one run again");
        assert_eq!(ks.holder_blocks(), 64);
        ks.check_invariants().expect("invariants");
    }

    /// The block arrays do not grow past free room: a run evicted tail-first keeps only a
    /// little spare, and a store longer than any free range fills the longest one first.
    #[test]
    fn block_arrays_reuse_free_room() {
        let mut ks = Keyspace::new(KeyspaceId::new("t", 64, 1), EngineConfig::default());
        let a: Vec<BlockHashes> =
            (1..=1000).map(|i| (10_000 + i, 1_000_000 + i)).map(BlockHashes::from).collect();
        let b: Vec<BlockHashes> =
            (1..=1000).map(|i| (20_000 + i, 2_000_000 + i)).map(BlockHashes::from).collect();
        ks.store(HolderKey::new(1, 0, 0), None, &a, 1).expect("stored");
        ks.store(HolderKey::new(2, 0, 0), None, &b, 2).expect("stored");
        let top = ks.trie.blocks.top();
        // Worker 2 evicts 900 of its blocks: the arrays end where its run (and spare) ends.
        let tail: Vec<u64> = b[100..].iter().rev().map(|x| x.ext).collect();
        assert_eq!(ks.remove(HolderKey::new(2, 0, 0), &tail, 3), (900, 0));
        assert!(ks.trie.blocks.top() <= top - 900 + crate::trie::SPARE_KEPT);
        // Worker 1 evicts all of chain `a`: 1,000 free blocks in the middle. A 1,500-block
        // store takes them and only 500 (plus the spare given back) from the end.
        let all: Vec<u64> = a.iter().rev().map(|x| x.ext).collect();
        assert_eq!(ks.remove(HolderKey::new(1, 0, 0), &all, 4), (1000, 0));
        let top = ks.trie.blocks.top();
        let c: Vec<BlockHashes> =
            (1..=1500).map(|i| (30_000 + i, 3_000_000 + i)).map(BlockHashes::from).collect();
        ks.store(HolderKey::new(3, 0, 0), None, &c, 5).expect("stored");
        assert!(ks.trie.blocks.top() <= top + 500, "{} > {} + 500", ks.trie.blocks.top(), top);
        ks.check_invariants().expect("invariants");
        let full = crate::types::MatchOptions::default();
        let locals: Vec<u64> = c.iter().map(|x| x.local).collect();
        assert_eq!(ks.match_chain(&locals, &full)[0].depth, 1500);
    }
}

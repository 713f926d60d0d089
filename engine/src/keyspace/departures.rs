//! How holders leave a keyspace: their worker's departure ([`Keyspace::drop_worker`]), placement
//! expiry ([`Keyspace::expire`]), and inferred holders forgotten once they hold nothing. Each
//! visits only the holders it changes, found through the derived indices of `holders` (a
//! worker's key range, the expiry queue), never every holder of the keyspace.

use crate::keyspace::Keyspace;
use crate::types::LogTime;

impl Keyspace {
    /// Removes every holder of `worker` (all dp ranks and lanes): only those holders are
    /// visited, whatever else the keyspace holds.
    pub fn drop_worker(&mut self, worker: u64) -> u32 {
        let victims = self.holders.of_worker(worker);
        self.visited += victims.len() as u64;
        let mut n = 0;
        for h in victims {
            let snap = self.snap(h);
            n += self.clear_blocks(h);
            self.settle(h, snap);
            self.holders.remove(h);
        }
        self.stats.blocks_removed += u64::from(n);
        n
    }

    /// Expires inferred blocks older than the placement TTL at log time `now`, for the holders
    /// of log partition `group` (the one whose log time advanced), and forgets holders left with
    /// no blocks. Visits only holders filed for expiry at or before `now - ttl` (in key order),
    /// never the whole keyspace. Returns the number of blocks expired.
    pub fn expire(&mut self, now: LogTime, group: u32) -> u64 {
        let Some(cutoff) = now.checked_sub(self.cfg.placement_ttl_ms) else { return 0 };
        let mut n = 0;
        let due = self.holders.due(group, cutoff);
        self.visited += due.len() as u64;
        for h in due {
            self.holders.unqueue(h);
            let snap = self.snap(h);
            n += self.expire_holder(h, now);
            self.settle(h, snap);
            if let Some(front) = self.holders.at(h).records.front().map(|r| r.time) {
                self.holders.queue(h, front);
            }
            self.gc_holder(h);
        }
        n
    }

    /// Whether [`Self::expire`] at `now` would visit any holder of `group` (a read-only check,
    /// so callers need not take the write lock when nothing is due).
    pub fn expiry_due(&self, now: LogTime, group: u32) -> bool {
        let Some(cutoff) = now.checked_sub(self.cfg.placement_ttl_ms) else { return false };
        self.holders.next_due(group).is_some_and(|t| t <= cutoff)
    }

    pub(crate) fn expire_holder(&mut self, h: u32, now: LogTime) -> u64 {
        let ttl = self.cfg.placement_ttl_ms;
        let mut n = 0;
        while let Some(&rec) = self.holders.at(h).records.front() {
            if rec.time.saturating_add(ttl) > now {
                break;
            }
            self.holders.at_mut(h).records.pop_front();
            n += u64::from(self.evict_record(h, rec));
        }
        self.stats.expired_ttl += n;
        n
    }

    /// Forgets an inferred holder that has no blocks left (its remaining records own nothing).
    pub(crate) fn gc_holder(&mut self, h: u32) {
        let holder = self.holders.at(h);
        if !holder.fed && holder.blocks == 0 {
            self.clear_blocks(h);
            self.holders.remove(h);
        }
    }
}

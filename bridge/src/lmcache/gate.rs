//! LMCache's admission rules for one emitter's stream, as its coordinator's `EventGate`
//! applies them (LMCache 0.5.6, `lmcache/v1/mp_coordinator/ingest/event_gate.py`,
//! Apache-2.0; written here from its documented behaviour):
//!
//! - an incarnation below the cursor's is stale: dropped;
//! - a higher incarnation is a restart: the emitter's L1 placements are void (fenced) and the
//!   cursor starts over at the new incarnation;
//! - within an incarnation, `seq <= last` is a duplicate: dropped;
//! - `seq > last + 1` is a gap. LMCache admits the batch and flags the emitter's slice stale
//!   until a replay; prefixlog clears the instance and starts over (the module doc of
//!   [`super`] says why), so [`Admit::gap`] tells the caller to.
//!
//! A first batch starts a cursor at `last_seq = 0`, as LMCache's does, so a stream first seen
//! past seq 1 (a bridge started after retention cut the topic's start) is a gap too.

/// One emitter's cursor: `(incarnation, last_seq)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    pub incarnation: u64,
    pub last_seq: u64,
}

/// What to do with a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Admit(Admit),
    /// Same incarnation, `seq <= last`: already admitted.
    Duplicate,
    /// An incarnation older than the cursor's.
    Stale,
}

/// An admitted batch, and what it tells about the stream before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admit {
    /// A higher incarnation than the cursor's (the emitter restarted): fence its L1 first.
    pub restart: bool,
    /// Batches of this incarnation before it were never seen.
    pub gap: bool,
}

/// Offers `(incarnation, seq)` to `cursor` (`None`: the emitter was never seen), updating it
/// when the batch is admitted.
pub fn offer(cursor: &mut Option<Cursor>, incarnation: u64, seq: u64) -> Verdict {
    let mut restart = false;
    if let Some(c) = cursor {
        if incarnation < c.incarnation {
            return Verdict::Stale;
        }
        if incarnation > c.incarnation {
            restart = true;
        } else if seq <= c.last_seq {
            return Verdict::Duplicate;
        }
    }
    let last = match cursor {
        Some(c) if !restart => c.last_seq,
        _ => 0,
    };
    *cursor = Some(Cursor { incarnation, last_seq: seq });
    Verdict::Admit(Admit { restart, gap: seq > last + 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(restart: bool, gap: bool) -> Verdict {
        Verdict::Admit(Admit { restart, gap })
    }

    #[test]
    fn dedups_fences_and_finds_gaps_as_lmcaches_gate_does() {
        let mut c = None;
        assert_eq!(offer(&mut c, 10, 1), admit(false, false));
        assert_eq!(offer(&mut c, 10, 2), admit(false, false));
        assert_eq!(offer(&mut c, 10, 2), Verdict::Duplicate);
        assert_eq!(offer(&mut c, 10, 1), Verdict::Duplicate);
        assert_eq!(offer(&mut c, 10, 5), admit(false, true));
        assert_eq!(c, Some(Cursor { incarnation: 10, last_seq: 5 }));
        // A restart: the new incarnation's seq starts at 1 again.
        assert_eq!(offer(&mut c, 11, 1), admit(true, false));
        assert_eq!(offer(&mut c, 10, 6), Verdict::Stale);
        assert_eq!(c, Some(Cursor { incarnation: 11, last_seq: 1 }));
        // A restart first seen past its seq 1 is also a gap.
        assert_eq!(offer(&mut c, 12, 3), admit(true, true));
        // A stream first seen past seq 1.
        let mut fresh = None;
        assert_eq!(offer(&mut fresh, 1, 4), admit(false, true));
    }
}

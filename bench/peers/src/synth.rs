//! A second workload shape, generated: long prompts with few shared prefixes.
//!
//! The bundled trace is conversations behind one shared system prompt, with modest prompts
//! (24 trace ids on average). This shape stresses the other end: a handful of system prompts,
//! each conversation opening with a long document of its own (30..180 trace ids, i.e. 240..1,440
//! blocks at the default stretch), then 1..6 turns that each append 2..12 ids. Conversations
//! are interleaved turn by turn in a seeded order, so caches churn and chains are evicted
//! tail-first while others grow. Requests come out in the trace format, so routing (by the
//! second id: the conversation) and the fleet of LRU caches are the same as for the trace.

use prefixlog_workload::trace::mix64;
use prefixlog_workload::TraceRequest;

/// Shape parameters of [`long_prompts`].
pub struct LongPrompts {
    pub conversations: u64,
    pub system_prompts: u64,
    pub seed: u64,
}

impl Default for LongPrompts {
    fn default() -> Self {
        Self { conversations: 4_000, system_prompts: 8, seed: 7 }
    }
}

/// A uniform draw in `lo..hi` from a hash of `x`.
fn draw(x: u64, lo: u64, hi: u64) -> u64 {
    lo + mix64(x) % (hi - lo)
}

/// The requests: every turn of every conversation, conversations interleaved.
pub fn long_prompts(p: &LongPrompts) -> Vec<TraceRequest> {
    // One entry per (conversation, turn): ordered by a seeded key, turns of one conversation in
    // order (a turn's key is its conversation's start key plus a growing offset).
    let mut turns: Vec<(u64, u64, u64)> = Vec::new();
    for c in 0..p.conversations {
        let start = mix64(c ^ p.seed) % (1 << 40);
        let n = draw(c ^ p.seed << 8, 1, 7);
        let mut at = start;
        for t in 0..n {
            turns.push((at, c, t));
            at += draw(c << 8 | t ^ p.seed, 1 << 34, 1 << 37);
        }
    }
    turns.sort_unstable();
    turns
        .iter()
        .enumerate()
        .map(|(i, &(_, c, t))| TraceRequest { timestamp_ms: i as u64, hash_ids: conversation_ids(p, c, t) })
        .collect()
}

/// The ids of conversation `c` as of turn `t`: system prompt, the conversation's own id, its
/// document, then the appended turns. Ids never collide across conversations.
fn conversation_ids(p: &LongPrompts, c: u64, t: u64) -> Vec<u64> {
    let base = 1_000_000 + c * 10_000;
    let mut ids = vec![c % p.system_prompts, base];
    let doc = draw(c ^ p.seed << 16, 30, 181);
    ids.extend((1..=doc).map(|i| base + i));
    let mut next = base + doc + 1;
    for turn in 0..=t {
        let len = draw(c << 8 | turn ^ p.seed << 24, 2, 13);
        ids.extend(next..next + len);
        next += len;
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_extend_their_conversation_and_ids_do_not_collide() {
        let p = LongPrompts { conversations: 50, ..Default::default() };
        let reqs = long_prompts(&p);
        let mut last: std::collections::HashMap<u64, Vec<u64>> = Default::default();
        for r in &reqs {
            let conv = r.hash_ids[1];
            if let Some(prev) = last.get(&conv) {
                assert!(r.hash_ids.starts_with(prev), "a turn extends the previous one");
            }
            last.insert(conv, r.hash_ids.clone());
        }
        assert_eq!(last.len(), 50);
        let mut own: Vec<u64> = last.values().flat_map(|ids| ids[1..].iter().copied()).collect();
        let n = own.len();
        own.sort_unstable();
        own.dedup();
        assert_eq!(own.len(), n, "conversation ids are disjoint");
    }
}

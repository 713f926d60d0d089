//! Seeded random tries: every `top_k` answer must be the all-holders answer cut to k, entry
//! for entry (same holders, same order, same details), whatever the ties between holders of
//! equal depth, the tiers, the holes and the query's filters. The top-k walk takes another
//! path than the all-holders walk (it finds the k best without crediting every holder), so
//! this is a differential test of the two.
//!
//! `PREFIXLOG_TOPK_SEEDS=N` runs N seeds (default 40).

use prefixlog_engine::{
    BlockHashes, EngineConfig, HolderKey, HolderMatch, Keyspace, KeyspaceId, MatchOptions, Tier,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// ext of a block: derived from the chain, the same for every holder.
fn ext(chain: &[u64]) -> u64 {
    chain.iter().fold(0x5eedu64, |h, &l| prefixlog_engine::digest::mix64(h.rotate_left(7) ^ l))
}

fn blocks(chain: &[u64]) -> Vec<BlockHashes> {
    (0..chain.len()).map(|i| BlockHashes::new(ext(&chain[..=i]), chain[i])).collect()
}

/// A random chain over a small alphabet (so chains share prefixes and branch), sometimes
/// continuing one of the `seen` ones.
fn chain(rng: &mut ChaCha8Rng, seen: &[Vec<u64>]) -> Vec<u64> {
    let mut c = if !seen.is_empty() && rng.random_bool(0.7) {
        let s = &seen[rng.random_range(0..seen.len())];
        s[..rng.random_range(1..=s.len())].to_vec()
    } else {
        Vec::new()
    };
    let more = rng.random_range(if c.is_empty() { 1 } else { 0 }..8);
    c.extend((0..more).map(|_| rng.random_range(1..4u64)));
    c
}

struct World {
    ks: Keyspace,
    chains: Vec<Vec<u64>>,
    keys: Vec<HolderKey>,
}

/// `workers` workers (two lanes, tiers when `tiers`), storing prefixes of shared chains, with
/// removals that leave holes and evicted heads.
fn world(seed: u64, workers: u64, tiers: bool) -> World {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cfg = EngineConfig { holder_capacity: 64, ..EngineConfig::default() };
    let mut ks = Keyspace::new(KeyspaceId::new("topk", 16, 1), cfg);
    let mut chains: Vec<Vec<u64>> = Vec::new();
    let mut keys = Vec::new();
    // A prefix held by almost everyone (a system prompt), so the first runs are crowded.
    let system: Vec<u64> = (0..rng.random_range(1..6)).map(|_| rng.random_range(1..4u64)).collect();
    for step in 0..workers * 12 {
        let mut key = HolderKey::new(rng.random_range(0..workers), 0, rng.random_range(0..2));
        if tiers && rng.random_bool(0.4) {
            key = key.on(Tier::ALL[rng.random_range(1..4)]);
        }
        keys.push(key);
        if rng.random_bool(0.15) && !chains.is_empty() {
            // Remove one block of a chain: a hole, or an evicted head.
            let c = &chains[rng.random_range(0..chains.len())];
            let at = rng.random_range(1..=c.len());
            ks.remove(key, &[ext(&c[..at])], step);
            continue;
        }
        let mut c = if rng.random_bool(0.5) { system.clone() } else { Vec::new() };
        c.extend(chain(&mut rng, &chains));
        let _ = ks.store(key, None, &blocks(&c), step);
        chains.push(c);
    }
    keys.sort_unstable();
    keys.dedup();
    World { ks, chains, keys }
}

/// Random query options: filters and tier orders (tier weights sometimes, which the top-k
/// walk leaves to the all-holders path: checked all the same).
fn options(rng: &mut ChaCha8Rng, w: &World, tiers: bool) -> MatchOptions {
    let mut o = MatchOptions::default();
    if rng.random_bool(0.2) {
        o.lane = Some(rng.random_range(0..2));
    }
    if rng.random_bool(0.2) {
        let n = rng.random_range(0..6);
        o.candidates = Some((0..n).map(|_| w.keys[rng.random_range(0..w.keys.len())].worker).collect());
    }
    o.exclude_gapped = rng.random_bool(0.2);
    if tiers && rng.random_bool(0.5) {
        let mut order = Tier::ALL.to_vec();
        order.retain(|_| rng.random_bool(0.7));
        if order.is_empty() {
            order.push(Tier::Host);
        }
        let n = order.len();
        order.rotate_left(rng.random_range(0..n));
        o.tiers = order;
    }
    if rng.random_bool(0.1) {
        o.tier_weights = Some([1000, rng.random_range(0..1000), 300, 0]);
    }
    o
}

fn check_world(seed: u64, workers: u64, tiers: bool) {
    let w = world(seed, workers, tiers);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xabc);
    let mut best_answered = 0;
    for q in 0..60 {
        let mut query = w.chains[rng.random_range(0..w.chains.len())].clone();
        if rng.random_bool(0.3) {
            query.extend(chain(&mut rng, &[]));
        }
        best_answered += usize::from(check_best_holders(
            &w.ks,
            &query,
            tiers,
            &format!("seed {seed} workers {workers} query {q}"),
        ));
        let mut opts = options(&mut rng, &w, tiers);
        let all = w.ks.match_chain(&query, &opts);
        let ks: Vec<usize> =
            [1, 2, 3, 5, 8, all.len(), all.len() + 1].into_iter().filter(|&k| k > 0).collect();
        for k in ks {
            opts.top_k = Some(k);
            let top = w.ks.match_chain(&query, &opts);
            assert_eq!(
                top,
                all[..k.min(all.len())],
                "seed {seed} workers {workers} tiers {tiers} query {q} {query:?} k {k} opts {opts:?}"
            );
        }
    }
    if !tiers {
        assert!(best_answered > 0, "seed {seed} workers {workers}: the best-holders walk never answered");
    }
}

/// `best_holders_into` is the all-holders answer's entries at its best depth (every tie), or
/// declines: always with holders off the GPU, and never on a GPU-only keyspace with an answer
/// the walk's budget allows (checked: it answered at least once per GPU-only world).
fn check_best_holders(ks: &Keyspace, query: &[u64], tiers: bool, what: &str) -> bool {
    let all = ks.match_chain(query, &MatchOptions::default());
    let best = all.first().map_or(0, |m| m.depth);
    let mut got = all.clone(); // whatever is in the buffer is replaced
    let answered = ks.best_holders_into(query, &mut got);
    if answered {
        let want: Vec<HolderMatch> = all.iter().filter(|m| m.depth == best).cloned().collect();
        assert_eq!(got, want, "{what}: best holders {query:?}");
    } else {
        assert!(got.is_empty(), "{what}: declined with entries left");
    }
    if tiers && ks.holder_summaries().iter().any(|h| h.key.tier != Tier::Gpu) {
        assert!(!answered, "{what}: answered with holders off the GPU");
    }
    answered
}

fn seeds() -> u64 {
    std::env::var("PREFIXLOG_TOPK_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40)
}

#[test]
fn top_k_is_the_all_holders_answer_cut_gpu_only() {
    for seed in 0..seeds() {
        // Few workers (member lists scanned) and many (binary-searched by key).
        check_world(seed, 6, false);
        check_world(seed, 60, false);
    }
}

#[test]
fn top_k_is_the_all_holders_answer_cut_with_tiers() {
    for seed in 0..seeds() {
        check_world(seed, 6, true);
        check_world(seed, 60, true);
    }
}

/// Ties: many holders at the same depth are listed by key, whichever k cuts among them.
#[test]
fn ties_at_equal_depth_are_cut_in_key_order() {
    let mut ks = Keyspace::new(KeyspaceId::new("ties", 16, 1), EngineConfig::default());
    for worker in (0..40u64).rev() {
        let depth = 2 + (worker % 3) as usize;
        let _ = ks.store(HolderKey::new(worker, 0, 0), None, &blocks(&[1, 2, 3, 4][..depth]), worker);
    }
    let top = ks.match_chain(&[1, 2, 3, 4], &MatchOptions { top_k: Some(16), ..Default::default() });
    let got: Vec<(u64, u32)> = top.iter().map(|m| (m.holder.worker, m.depth)).collect();
    // Depth 4: workers 2, 5, 8, ... (13 of them), then depth 3 from worker 1 on.
    let mut want: Vec<(u64, u32)> = (0..40).filter(|w| w % 3 == 2).map(|w| (w, 4)).collect();
    want.extend((0..40).filter(|w| w % 3 == 1).map(|w| (w, 3)).take(3));
    assert_eq!(got, want);
}

//! States larger than the differential test reaches: several chunks of block storage (64k
//! blocks each), chains much longer than a run, dozens of holders under shared prefixes, and
//! an LRU fleet's tail-first eviction, plus holes punched in the middle of chains and
//! placements. Too big for the reference model, so each phase is checked against oracles that
//! do not depend on how the trie is cut into runs:
//!
//! - `check_invariants`;
//! - digests and block counts recomputed from the dump (one node per block position);
//! - answers of a brute-force matcher over the dump;
//! - a rebuild and a restored image that dump identically, and keep evolving identically
//!   under the same writes.

use prefixlog_engine::digest::{block_term, child_path, holder_term, mix64, ROOT_PATH};
use prefixlog_engine::{
    BlockHashes, EngineConfig, HolderKey, Keyspace, KeyspaceDump, KeyspaceId, MatchOptions,
};
use prefixlog_workload::{Event, Fleet};
use std::collections::{HashMap, HashSet};

const WORKERS: u32 = 40;

/// A request's chain: one of 30 shared prompts (50..700 blocks), then its own blocks.
fn chain(req: u64) -> Vec<BlockHashes> {
    let prompt = req % 30;
    let prompt_len = 50 + mix64(prompt) % 650;
    let own = 100 + mix64(req ^ 0xabc) % 1400;
    let mut ext = 0x5eed_u64;
    (0..prompt_len + own)
        .map(|i| {
            let local = if i < prompt_len { mix64(prompt << 20 | i) } else { mix64(req << 24 | i | 1 << 63) };
            ext = mix64(ext.rotate_left(17) ^ local);
            BlockHashes { ext, local }
        })
        .collect()
}

/// Applies a fleet event; every 7th store is cut into 32-block pieces (as the engine's
/// chunked writes do), the rest go in whole.
fn apply(ks: &mut Keyspace, ev: &Event, t: u64) {
    match ev {
        Event::Stored { worker, parent_ext, blocks } => {
            let key = HolderKey::new(u64::from(*worker), 0, 0);
            if t.is_multiple_of(7) {
                let mut parent = *parent_ext;
                for c in blocks.chunks(32) {
                    let _ = ks.store(key, parent, c, t);
                    parent = c.last().map(|b| b.ext);
                }
            } else {
                let _ = ks.store(key, *parent_ext, blocks, t);
            }
        }
        Event::Removed { worker, exts } => {
            ks.remove(HolderKey::new(u64::from(*worker), 0, 0), exts, t);
        }
    }
}

/// Requests `from..to` through the fleet into every keyspace given, plus holes (a block from
/// the middle of a chain) and placements by inferred holders.
fn feed(fleet: &mut Fleet, targets: &mut [&mut Keyspace], from: u64, to: u64) {
    for req in from..to {
        let c = chain(req);
        let worker = (mix64(req * 31) % u64::from(WORKERS)) as u32;
        for ev in fleet.serve(worker, &c) {
            targets.iter_mut().for_each(|ks| apply(ks, &ev, req));
        }
        if req % 5 == 0 {
            let key = HolderKey::new(u64::from(worker), 0, 0);
            let hole = [c[c.len() / 3].ext, c[c.len() / 2].ext];
            targets.iter_mut().for_each(|ks| {
                ks.remove(key, &hole, req);
            });
        }
        if req % 11 == 0 {
            let locals: Vec<u64> = c[..c.len() * 2 / 3].iter().map(|b| b.local).collect();
            let key = HolderKey::new(1000 + req % 3, 0, 0);
            targets.iter_mut().for_each(|ks| {
                ks.place(key, &locals, req);
            });
        }
    }
}

/// Digests, block counts and answers recomputed from the dump alone.
struct Oracle {
    paths: Vec<u64>,
    children: HashMap<(u32, u64), u32>,
    members: Vec<HashSet<u32>>,
}

impl Oracle {
    fn new(d: &KeyspaceDump) -> Self {
        let mut paths = vec![ROOT_PATH];
        let mut children = HashMap::new();
        for (i, n) in d.nodes.iter().enumerate() {
            paths.push(child_path(paths[n.parent as usize], n.local));
            assert!(children.insert((n.parent, n.local), i as u32 + 1).is_none(), "one child per local");
        }
        let members = d.holders.iter().map(|h| h.members.iter().map(|m| m.0).collect()).collect();
        Self { paths, children, members }
    }

    fn check_digests(&self, d: &KeyspaceDump, ks: &Keyspace) {
        let mut total = 0u64;
        for (h, dh) in d.holders.iter().enumerate() {
            let digest = dh
                .members
                .iter()
                .fold(0u64, |s, m| s.wrapping_add(block_term(self.paths[m.0 as usize], !dh.fed)));
            let s = ks.holder(&dh.key).unwrap();
            assert_eq!((s.blocks, s.digest), (self.members[h].len() as u32, digest), "{}", dh.key);
            total = total.wrapping_add(holder_term(&dh.key, s.blocks, digest));
        }
        assert_eq!(ks.digest(), total);
    }

    fn check_match(&self, d: &KeyspaceDump, ks: &Keyspace, q: &[u64]) {
        let mut nodes = Vec::new();
        let mut cur = 0u32;
        for &l in q {
            let Some(&n) = self.children.get(&(cur, l)) else { break };
            nodes.push(n);
            cur = n;
        }
        let mut want: Vec<(HolderKey, u32)> = d
            .holders
            .iter()
            .enumerate()
            .map(|(h, dh)| (dh.key, nodes.iter().take_while(|n| self.members[h].contains(n)).count() as u32))
            .filter(|&(_, depth)| depth > 0)
            .collect();
        want.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let got: Vec<(HolderKey, u32)> =
            ks.match_chain(q, &MatchOptions::default()).iter().map(|m| (m.holder, m.depth)).collect();
        assert_eq!(got, want, "query of {} blocks", q.len());
    }
}

fn check_phase(ks: &Keyspace, phase: u64) {
    ks.check_invariants().unwrap_or_else(|e| panic!("phase {phase}: {e}"));
    let d = ks.dump();
    let oracle = Oracle::new(&d);
    oracle.check_digests(&d, ks);
    for req in (0..phase * 150).step_by(37) {
        let c: Vec<u64> = chain(req).iter().map(|b| b.local).collect();
        oracle.check_match(&d, ks, &c);
        oracle.check_match(&d, ks, &c[..c.len() / 2]);
    }
}

#[test]
fn large_states_agree_with_their_dump_and_rebuild() {
    // Chains of up to 2,200 blocks then cross run limits (any limit gives the same answers).
    prefixlog_engine::testing::set_max_run_for_test(700);
    let cfg = EngineConfig { holder_capacity: 9000, inferred_capacity: 3000, ..Default::default() };
    let mut ks = Keyspace::new(KeyspaceId::new("m", 16, 1), cfg.clone());
    let mut fleet = Fleet::new(WORKERS as usize, 8000);
    for phase in 1..=4u64 {
        feed(&mut fleet, &mut [&mut ks], (phase - 1) * 150, phase * 150);
        check_phase(&ks, phase);
    }
    assert!(ks.node_count() > 3 * 65_536, "{} blocks: several chunks", ks.node_count());
    let dump = ks.dump();
    let mut rebuilt = Keyspace::rebuild(&dump, cfg.clone()).unwrap();
    assert_eq!(rebuilt.dump(), dump);
    rebuilt.check_invariants().unwrap();
    let mut image = Vec::new();
    ks.write_image(&mut image).unwrap();
    let mut restored = Keyspace::read_image(&image, cfg).unwrap();
    assert_eq!(restored.dump(), dump);
    feed(&mut fleet, &mut [&mut ks, &mut rebuilt, &mut restored], 600, 750);
    check_phase(&rebuilt, 5);
    check_phase(&restored, 5);
    let d = ks.dump();
    assert_eq!(rebuilt.dump(), d, "a rebuild evolves like the original");
    assert_eq!(restored.dump(), d, "a restored image evolves like the original");
}

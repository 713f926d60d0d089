//! The tables against a map: collisions, removals, growth ahead, reservation.

use super::*;
use std::collections::BTreeMap;

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Differential test against a BTreeMap under inserts, removes and lookups, with hashes
/// drawn from a small set so clusters, wrap-around and equal stored bits are common.
#[test]
fn behaves_like_a_map_under_collisions_and_removals() {
    for seed in 0..40u64 {
        let mut t = NodeTable::default();
        let mut reference: BTreeMap<u32, u64> = BTreeMap::new();
        let mut x = seed;
        // Few distinct tags and few parts: heavy collisions; equal tags with other low
        // bits (told apart by `eq` only), and equal low 32 bits too.
        let hash_of = |node: u32| -> u64 {
            let r = mix(u64::from(node) ^ seed);
            ((r & 0x3) << 32)
                | ((r >> 8) & 0x3f) << 16
                | (r & 0x3)
                | if node.is_multiple_of(7) { 0x8000_0000 } else { 0 }
        };
        for _ in 0..4000 {
            x = mix(x);
            let node = 1 + (x % 600) as u32;
            let h = hash_of(node);
            match (x >> 20) % 3 {
                0 => {
                    if let std::collections::btree_map::Entry::Vacant(v) = reference.entry(node) {
                        v.insert(h);
                        t.insert(h, node);
                    }
                }
                1 => assert_eq!(t.remove(h, node), reference.remove(&node).is_some(), "seed {seed}"),
                _ => {
                    let got = t.find(h, |n| n == node);
                    assert_eq!(got, reference.contains_key(&node).then_some(node), "seed {seed}");
                }
            }
            assert_eq!(t.len(), reference.len());
        }
        for (&node, &h) in &reference {
            assert_eq!(t.find(h, |n| n == node), Some(node), "seed {seed}: survivor {node}");
        }
        // A lookup by hash alone sees only nodes stored under the same part and tag.
        for (&node, &h) in &reference {
            let mut seen = Vec::new();
            t.find(h, |n| {
                seen.push(n);
                false
            });
            assert!(seen.contains(&node));
            assert!(seen.iter().all(|n| NodeTable::signature(reference[n]) == NodeTable::signature(h)));
        }
    }
}

/// A writer that calls `grow_ahead` + `install` before every 32 inserts (as
/// `Engine::store` does per locked chunk) never grows a large part in place, and the
/// table stays a map.
#[test]
fn growth_ahead_leaves_large_parts_room_for_the_next_writes() {
    let caps = |t: &NodeTable| t.parts.iter().map(|s| s.slots.len()).collect::<Vec<_>>();
    let mut t = NodeTable::default();
    let (mut installed, mut n) = (0, 0u32);
    for _batch in 0..20_000 {
        let grown = t.grow_ahead();
        installed += grown.len();
        let replaced = t.install(grown);
        assert!(replaced.iter().all(|a| a.len() >= AHEAD_MIN_SLOTS));
        let before = caps(&t);
        for _ in 0..32 {
            n += 1;
            t.insert(mix(u64::from(n)), n);
        }
        for (s, (&b, a)) in before.iter().zip(caps(&t)).enumerate() {
            assert!(b < AHEAD_MIN_SLOTS || a == b, "part {s} grew in place from {b} to {a} slots");
        }
    }
    assert!(installed >= PARTS, "every part grew ahead at least once ({installed})");
    for k in 1..=n {
        assert_eq!(t.find(mix(u64::from(k)), |c| c == k), Some(k));
    }
    assert_eq!(t.len(), n as usize);
}

#[test]
fn reserve_keeps_entries_and_prevents_growth() {
    let mut t = NodeTable::default();
    for n in 1..1000u32 {
        t.insert(mix(u64::from(n)), n);
    }
    t.reserve(100_000);
    let bytes = t.heap_bytes();
    for n in 1000..101_000u32 {
        t.insert(mix(u64::from(n)), n);
    }
    assert_eq!(t.heap_bytes(), bytes, "reserved room was enough");
    for n in 1..101_000u32 {
        assert_eq!(t.find(mix(u64::from(n)), |c| c == n), Some(n));
    }
}

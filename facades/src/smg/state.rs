//! `Pull`, `PullHolders` and `Digests`: the replica's SMG holders, from an engine dump of each
//! SMG keyspace (scheme 2 or 3), for `radix-index-dump` and operators. SMG replicas should not
//! bootstrap from prefixlog: prefixlog replicas recover from the log and their checkpoints.
//!
//! Per holder (a worker named by `smg.holder`, lane 0) one synthetic `Update`:
//! `{keyspace, holder, epoch, seq = last_seq}` of its feed (0 for a placement-only holder, whose
//! epoch prefixlog does not keep), `added{capacity_blocks, event_fed, metadata}` as recorded,
//! and its blocks as `Stored` events in path order, one per chain segment, each naming its
//! parent. `seq_hash` is the ext the holder stored the block under; for placements (no ext)
//! the SMG placement chain recomputed from the content hashes (wire scheme v1:
//! `seq[0] = content[0]`, `seq[i] = chain_prefix_hash(seq[i-1], content[i])`). A run that
//! starts past position 0 (its parent not held) is not shipped: a consumer would anchor it at
//! a parent the holder does not hold (or at position 0, as upstream re-anchors), crediting
//! blocks at positions the holder does not hold them. Its blocks still count in `Digests`.
//!
//! `Digests`: per holder `blocks` (held), `digest_xor` / `digest_sum` over the held blocks'
//! content hashes (XOR; wrapping sum of `c * 0x9E3779B97F4A7C15`), `epoch` / `last_seq` /
//! `event_fed` as above.

use super::keyspace::unmap;
use super::pb::{event::Kind, Added, Block, Event, HolderDigest, HolderRef, Stored, Update};
use super::writer::{from_hex, META_CAPACITY, META_HOLDER, META_LANE_META};
use super::LANE;
use crate::names::{worker_id, SMG_SEED};
use prefixlog_engine::{partition_of, DumpHolder, KeyspaceDump, KeyspaceId};
use prefixlog_query::QueryService;
use prefixlog_state::partition_state::FeedKey;
use std::collections::{BTreeMap, BTreeSet};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The seed of SMG's wire hash scheme v1.
pub const WIRE_SEED: u64 = 1337;
/// The multiplier of `digest_sum`.
pub const DIGEST_MUL: u64 = 0x9E37_79B9_7F4A_7C15;

/// SMG wire scheme v1 `chain_prefix_hash(prev, cur)`: XXH3-64, seed 1337, of `prev_le || cur_le`.
pub fn chain_prefix_hash(prev: u64, cur: u64) -> u64 {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&prev.to_le_bytes());
    b[8..].copy_from_slice(&cur.to_le_bytes());
    xxh3_64_with_seed(&b, WIRE_SEED)
}

/// SMG wire scheme v1 `content_hash` of one block: XXH3-64, seed 1337, of its token ids as
/// u32 little-endian (prefixlog scheme 2's locals).
pub fn content_hash(tokens: &[u32]) -> u64 {
    let b: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&b, WIRE_SEED)
}

/// What the replica records about one SMG holder.
#[derive(Clone, Debug, Default)]
struct Recorded {
    name: String,
    metadata: BTreeMap<String, String>,
    /// `(epoch, last_seq)` of its feed per keyspace.
    feeds: BTreeMap<KeyspaceId, (u64, u64)>,
}

/// Which holders to visit: every one, or these `(keyspace, name)`.
pub type Filter = Option<BTreeSet<(KeyspaceId, String)>>;

/// The filter of a `PullHolders` request (unmappable refs are left out: they hold nothing here).
pub fn filter_of(refs: &[HolderRef]) -> Filter {
    let set = refs
        .iter()
        .filter_map(|r| Some((super::keyspace::map(r.keyspace.as_ref()).ok()?, r.holder.clone())))
        .collect();
    Some(set)
}

/// The SMG keyspaces the replica holds.
pub fn keyspaces(query: &QueryService) -> Vec<KeyspaceId> {
    query.view().engine.keyspace_ids().into_iter().filter(|id| unmap(id).is_some()).collect()
}

/// The synthetic updates of one keyspace's holders (those `filter` keeps).
pub fn updates(query: &QueryService, id: &KeyspaceId, filter: &Filter) -> Vec<Update> {
    visit(query, id, filter, |dump, h, rec| {
        let ks = unmap(id);
        let (epoch, last_seq) = rec.feeds.get(id).copied().unwrap_or((0, 0));
        let added = Added {
            capacity_blocks: rec.metadata.get(META_CAPACITY).and_then(|c| c.parse().ok()).unwrap_or(0),
            event_fed: h.fed,
            metadata: rec.metadata.get(META_LANE_META).and_then(|m| from_hex(m)).unwrap_or_default(),
        };
        let events = chains(dump, h).into_iter().map(|s| Event { kind: Some(Kind::Stored(s)) }).collect();
        let seq = if h.fed { last_seq } else { 0 };
        Update {
            keyspace: ks,
            holder: rec.name.clone(),
            epoch,
            seq,
            events,
            added: Some(added),
            dropped: false,
        }
    })
}

/// The digests of one keyspace's holders.
pub fn digests(query: &QueryService, id: &KeyspaceId) -> Vec<HolderDigest> {
    visit(query, id, &None, |dump, h, rec| {
        let (epoch, last_seq) = rec.feeds.get(id).copied().unwrap_or((0, 0));
        let (mut xor, mut sum) = (0u64, 0u64);
        for &(n, _) in &h.members {
            let c = dump.nodes[n as usize - 1].local;
            xor ^= c;
            sum = sum.wrapping_add(c.wrapping_mul(DIGEST_MUL));
        }
        HolderDigest {
            keyspace: unmap(id),
            holder: rec.name.clone(),
            epoch,
            last_seq: if h.fed { last_seq } else { 0 },
            event_fed: h.fed,
            blocks: h.members.len() as u64,
            digest_xor: xor,
            digest_sum: sum,
        }
    })
}

/// `f` of every SMG holder of the keyspace that `filter` keeps, in holder-name order.
fn visit<T>(
    query: &QueryService,
    id: &KeyspaceId,
    filter: &Filter,
    f: impl Fn(&KeyspaceDump, &DumpHolder, &Recorded) -> T,
) -> Vec<T> {
    let Some(ks) = query.view().engine.keyspace(id) else { return Vec::new() };
    let dump = ks.read().dump();
    let workers: BTreeSet<u64> = dump.holders.iter().map(|h| h.key.worker).collect();
    let recorded = recorded(query, id, &workers);
    let mut out: Vec<(&String, T)> = dump
        .holders
        .iter()
        .filter(|h| h.key.dp_rank == 0 && h.key.lane == LANE && !h.members.is_empty())
        .filter_map(|h| {
            let rec = recorded.get(&h.key.worker)?;
            let keep = filter.as_ref().is_none_or(|s| s.contains(&(id.clone(), rec.name.clone())));
            keep.then(|| (&rec.name, f(&dump, h, rec)))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(b.0));
    out.into_iter().map(|(_, t)| t).collect()
}

/// The recorded name, metadata and feed of each worker that is an SMG holder (one lock).
fn recorded(query: &QueryService, id: &KeyspaceId, workers: &BTreeSet<u64>) -> BTreeMap<u64, Recorded> {
    let view = query.view();
    let Some(applier) = &view.applier else { return BTreeMap::new() };
    let a = applier.lock();
    let mut out = BTreeMap::new();
    for &w in workers {
        let part = a.partition(partition_of(w, view.info.partition_count));
        let Some(m) = part.workers.get(&w) else { continue };
        let Some(name) = m.get(META_HOLDER) else { continue };
        if worker_id(SMG_SEED, name) != w {
            continue;
        }
        let key = FeedKey { keyspace: id.clone(), worker: w, dp_rank: 0 };
        let feeds = part
            .feeds
            .get(&key)
            .map(|f| (id.clone(), (f.epoch, f.last_seq.unwrap_or(0))))
            .into_iter()
            .collect();
        out.insert(w, Recorded { name: name.clone(), metadata: m.clone(), feeds });
    }
    out
}

/// The holder's blocks as `Stored` segments in path order (see the module doc).
fn chains(dump: &KeyspaceDump, h: &DumpHolder) -> Vec<Stored> {
    let overrides: BTreeMap<u32, u64> = h.overrides.iter().map(|&(ext, n)| (n, ext)).collect();
    let placement = placement_chain(dump);
    let seq_of = |n: u32| -> u64 {
        let node = &dump.nodes[n as usize - 1];
        match (h.fed, overrides.get(&n), node.ext) {
            (true, Some(&e), _) | (true, None, Some(e)) => e,
            _ => placement[n as usize - 1],
        }
    };
    let (mut out, mut shipped, mut last): (Vec<Stored>, BTreeSet<u32>, Option<u32>) =
        (Vec::new(), BTreeSet::new(), None);
    for &(n, _) in &h.members {
        let node = &dump.nodes[n as usize - 1];
        let block = Block { seq_hash: seq_of(n), content_hash: node.local };
        if let (Some(cur), Some(l)) = (out.last_mut(), last) {
            if node.parent == l {
                cur.blocks.push(block);
                shipped.insert(n);
                last = Some(n);
                continue;
            }
        }
        let parent = match node.parent {
            0 => None,
            p if shipped.contains(&p) => Some(seq_of(p)),
            _ => continue,
        };
        out.push(Stored { parent_seq_hash: parent, blocks: vec![block] });
        shipped.insert(n);
        last = Some(n);
    }
    out
}

/// The SMG placement seq hash of every node (index = node number - 1; parents come first).
fn placement_chain(dump: &KeyspaceDump) -> Vec<u64> {
    let mut seq = Vec::with_capacity(dump.nodes.len());
    for n in &dump.nodes {
        let s = match n.parent {
            0 => n.local,
            p => chain_prefix_hash(seq[p as usize - 1], n.local),
        };
        seq.push(s);
    }
    seq
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_engine::{DumpNode, HolderKey, KeyspaceStats};

    /// Nodes 1..=5: a chain 1-2-3-5 (5 has no ext) and a branch 4 under 1.
    fn dump() -> KeyspaceDump {
        let node = |parent, local, ext| DumpNode { parent, local, ext };
        KeyspaceDump {
            id: KeyspaceId::new("m", 4, 2),
            nodes: vec![
                node(0, 11, Some(101)),
                node(1, 12, Some(102)),
                node(2, 13, Some(103)),
                node(1, 14, Some(104)),
                node(3, 15, None),
            ],
            holders: Vec::new(),
            stats: KeyspaceStats::default(),
        }
    }

    fn holder(fed: bool, members: &[u32], overrides: &[(u64, u32)]) -> DumpHolder {
        DumpHolder {
            key: HolderKey::new(1, 0, 0),
            fed,
            gapped: false,
            next_stamp: 0,
            last_time: 0,
            records: Vec::new(),
            members: members.iter().map(|&n| (n, 0)).collect(),
            overrides: overrides.to_vec(),
        }
    }

    /// A segment as `(parent, [(seq_hash, content_hash)])`.
    type Segment = (Option<u64>, Vec<(u64, u64)>);

    fn shape(v: &[Stored]) -> Vec<Segment> {
        v.iter()
            .map(|s| (s.parent_seq_hash, s.blocks.iter().map(|b| (b.seq_hash, b.content_hash)).collect()))
            .collect()
    }

    #[test]
    fn chains_are_segments_in_path_order_naming_their_parents() {
        let d = dump();
        let fed = chains(&d, &holder(true, &[1, 2, 4], &[]));
        assert_eq!(shape(&fed), vec![(None, vec![(101, 11), (102, 12)]), (Some(101), vec![(104, 14)])]);
        let renamed = chains(&d, &holder(true, &[1, 2], &[(999, 2)]));
        assert_eq!(shape(&renamed), vec![(None, vec![(101, 11), (999, 12)])], "the holder's own ext");
        let placed = chains(&d, &holder(false, &[1, 2], &[]));
        assert_eq!(shape(&placed), vec![(None, vec![(11, 11), (chain_prefix_hash(11, 12), 12)])]);
    }

    /// A run whose parent the holder does not hold would be anchored wrongly by a consumer.
    #[test]
    fn runs_past_a_missing_parent_are_not_shipped() {
        let d = dump();
        assert!(chains(&d, &holder(true, &[3, 5], &[])).is_empty());
        assert_eq!(shape(&chains(&d, &holder(true, &[1, 3], &[]))), vec![(None, vec![(101, 11)])]);
    }

    /// Upstream's golden vector: `chain_prefix_hash(0, content([0..256)))`.
    #[test]
    fn chain_prefix_hash_matches_the_wire_scheme() {
        assert_eq!(chain_prefix_hash(0, 0xbb79c83a0cdfbb76), 0x02639359a1a2c74b);
        let tokens: Vec<u32> = (0..256).collect();
        assert_eq!(content_hash(&tokens), 0xbb79c83a0cdfbb76);
        assert_eq!(content_hash(&[0; 256]), 0x5672308b9a027dcd);
        assert_eq!(content_hash(&[]), 0xd1f3e77444430ab9);
    }
}

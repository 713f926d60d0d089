//! `GET /dump` of the Dynamo dialect: the index as upstream's `RouterEvent`s, one entry per
//! indexer (`"<model>:<routing_group>"`) with its block size and the stored events that rebuild
//! what its workers hold (github.com/ai-dynamo/dynamo, `dump_registry` and
//! `protocols::RouterEvent`, Apache-2.0; docs/compat/dynamo-mooncake-http.md).
//!
//! Only keyspaces in Dynamo's hash scheme (2) are dumped: their locals are upstream's
//! `tokens_hash`; a scheme-1 keyspace's are prefixlog's chain hashes, which upstream could not
//! read back. An indexer is every routing group of a model that an announced worker names or
//! whose workers hold blocks; each of its event-fed lane-0 holders (worker, dp rank, tier)
//! gives one stored event per chain of blocks it holds (a chain ends where the holder holds
//! several children), its `block_hash` the holder's own engine hash of each block and its
//! `parent_hash` the holder's hash of the chain's parent. Upstream cuts chains along its radix
//! tree's nodes and names a block by the hash of the first worker that stored it, in an order
//! its hash maps choose: the same blocks per holder, grouped and numbered otherwise.
//!
//! Upstream keeps one tree per storage tier and drops a block no worker holds any more, which
//! cuts off the blocks below it: those are not dumped here either (they match nothing).
//!
//! Bounded: a dump of more than [`MAX_DUMP_BLOCKS`] holder blocks is refused (503).

use super::{DEFAULT_ROUTING_GROUP, META_ROUTING_GROUP};
use super::{META_BLOCK_SIZE, META_MODEL};
use prefixlog_engine::scheme::SCHEME_DYNAMO_BLOCK;
use prefixlog_engine::{partition_of, Tier};
use prefixlog_engine::{DumpHolder, KeyspaceDump};
use prefixlog_query::QueryService;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The most holder blocks one `/dump` answers (about 150 bytes of JSON each).
pub const MAX_DUMP_BLOCKS: u64 = 1 << 20;

/// `/dump` refused: the index is larger than one answer may be.
#[derive(Debug, thiserror::Error)]
#[error("the index holds {blocks} blocks in Dynamo's hash scheme, more than /dump answers ({MAX_DUMP_BLOCKS}); use prefixlog's own dump")]
pub struct TooLarge {
    pub blocks: u64,
}

/// Upstream's `StorageTier` names.
fn tier_name(t: Tier) -> &'static str {
    match t {
        Tier::Gpu => "device",
        Tier::Host => "host_pinned",
        Tier::Disk => "disk",
        Tier::External => "external",
    }
}

/// The dump: `{"<model>:<group>": {"block_size": n, "events": [...]}}`.
pub fn dump(query: &QueryService) -> Result<Value, TooLarge> {
    let view = query.view();
    let ids: Vec<_> =
        view.engine.keyspace_ids().into_iter().filter(|k| k.scheme == SCHEME_DYNAMO_BLOCK).collect();
    let blocks: u64 =
        ids.iter().filter_map(|k| view.engine.keyspace(k)).map(|k| k.read().holder_blocks()).sum();
    if blocks > MAX_DUMP_BLOCKS {
        return Err(TooLarge { blocks });
    }
    let groups = worker_groups(query);
    let group_of = |w: u64| groups.get(&w).map_or(DEFAULT_ROUTING_GROUP, |(_, g, _)| g.as_str()).to_string();
    let mut out: BTreeMap<String, (u32, Vec<Value>)> = BTreeMap::new();
    for (model, group, bs) in groups.values().filter_map(|(m, g, bs)| Some((m.clone()?, g.clone(), (*bs)?))) {
        out.entry(format!("{model}:{group}")).or_insert((bs, Vec::new()));
    }
    for id in &ids {
        let Some(cell) = view.engine.keyspace(id) else { continue };
        let d = cell.read().dump();
        let mut by_group: BTreeMap<String, Vec<&DumpHolder>> = BTreeMap::new();
        for h in d.holders.iter().filter(|h| h.fed && h.key.lane == 0 && !h.members.is_empty()) {
            by_group.entry(group_of(h.key.worker)).or_default().push(h);
        }
        for (group, holders) in by_group {
            let (bs, events) =
                out.entry(format!("{}:{group}", id.model)).or_insert((id.block_size, Vec::new()));
            if *bs != id.block_size {
                continue; // one block size per indexer, as upstream: the first one named
            }
            let reachable = reachable(&d, &holders);
            let mut ids_per_tier: BTreeMap<Tier, u64> = BTreeMap::new();
            for h in holders {
                events.extend(holder_events(&d, h, &reachable[&h.key.tier], &mut ids_per_tier));
            }
        }
    }
    Ok(Value::Object(
        out.into_iter().map(|(k, (bs, events))| (k, json!({"block_size": bs, "events": events}))).collect(),
    ))
}

/// Every announced worker's (model, routing group, block size) from its metadata: a worker
/// naming a model and a block size is an indexer of its own, if empty (upstream lists an
/// indexer as soon as a worker is registered in it).
fn worker_groups(query: &QueryService) -> BTreeMap<u64, (Option<String>, String, Option<u32>)> {
    let view = query.view();
    let mut out = BTreeMap::new();
    let Some(applier) = &view.applier else { return out };
    let a = applier.lock();
    for &p in &view.info.owned {
        for (&w, m) in &a.partition(p).workers {
            debug_assert_eq!(partition_of(w, view.info.partition_count), p);
            let group = m.get(META_ROUTING_GROUP).cloned().unwrap_or_else(|| DEFAULT_ROUTING_GROUP.into());
            let bs = m.get(META_BLOCK_SIZE).and_then(|b| b.parse().ok());
            out.insert(w, (m.get(META_MODEL).cloned(), group, bs));
        }
    }
    out
}

/// Per tier, the blocks reachable from the root through blocks some of `holders` hold on that
/// tier: upstream keeps one tree per tier and drops a block no worker holds, which cuts its
/// descendants off (they are neither matched nor dumped). Nodes are numbered parents first.
fn reachable(d: &KeyspaceDump, holders: &[&DumpHolder]) -> BTreeMap<Tier, Vec<bool>> {
    let mut out = BTreeMap::new();
    for tier in [Tier::Gpu, Tier::Host, Tier::Disk, Tier::External] {
        let mut ok = vec![false; d.nodes.len() + 1];
        ok[0] = true;
        for h in holders.iter().filter(|h| h.key.tier == tier) {
            h.members.iter().for_each(|m| ok[m.0 as usize] = true);
        }
        for (i, n) in d.nodes.iter().enumerate() {
            ok[i + 1] = ok[i + 1] && ok[n.parent as usize];
        }
        out.insert(tier, ok);
    }
    out
}

/// One holder's stored events: a chain of its reachable blocks per event, parents before
/// children.
fn holder_events(
    d: &KeyspaceDump,
    h: &DumpHolder,
    reachable: &[bool],
    ids: &mut BTreeMap<Tier, u64>,
) -> Vec<Value> {
    let held: BTreeSet<u32> = h.members.iter().map(|m| m.0).filter(|&n| reachable[n as usize]).collect();
    let own_ext: BTreeMap<u32, u64> = h.overrides.iter().map(|&(e, n)| (n, e)).collect();
    let ext = |n: u32| own_ext.get(&n).copied().or_else(|| d.nodes.get(n as usize - 1).and_then(|x| x.ext));
    let parent = |n: u32| d.nodes.get(n as usize - 1).map_or(0, |x| x.parent);
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &n in &held {
        children.entry(parent(n)).or_default().push(n);
    }
    // Chain heads: blocks whose parent the holder does not hold, then every branch.
    let mut heads: Vec<u32> = held.iter().copied().filter(|&n| !held.contains(&parent(n))).collect();
    heads.reverse();
    let mut out = Vec::new();
    while let Some(head) = heads.pop() {
        let mut chain = vec![head];
        loop {
            let kids = children.get(chain.last().expect("non-empty")).map_or(&[][..], Vec::as_slice);
            match kids {
                [one] => chain.push(*one),
                many => {
                    heads.extend(many.iter().rev());
                    break;
                }
            }
        }
        let p = parent(head);
        let parent_hash = (p != 0).then(|| ext(p)).flatten();
        let blocks: Vec<Value> = chain
            .iter()
            .map(|&n| json!({"block_hash": ext(n), "tokens_hash": d.nodes[n as usize - 1].local, "mm_extra_info": null}))
            .collect();
        let id = ids.entry(h.key.tier).or_insert(0);
        out.push(json!({
            "worker_id": h.key.worker,
            "storage_tier": tier_name(h.key.tier),
            "residency_domain": "worker",
            "event": {
                "event_id": *id,
                "data": {"stored": {"parent_hash": parent_hash, "start_position": null, "blocks": blocks}},
                "dp_rank": h.key.dp_rank,
            },
        }));
        *id += 1;
    }
    out
}

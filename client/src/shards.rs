//! The client's shard map: which groups of replicas to ask so that every partition is covered,
//! learned from `Describe` or given statically, and how shard answers merge.
//!
//! Merging is exact: every worker's records live in exactly one partition, so a worker's score
//! comes from exactly one shard, and the union of the shards' scores is the unsharded answer
//! (top-k cut after the merge; each shard was asked for its own top k, a superset of its share
//! of the global top k).

use crate::replicas::{ClientTls, ReplicaGroup, Unavailable};
use parking_lot::Mutex;
use prefixlog_ids::NextOffset;
use prefixlog_proto::v1::{
    prefix_index_client::PrefixIndexClient, DescribeRequest, MatchResponse, WorkerScore,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// One shard as the client sees it.
pub struct ShardGroup {
    /// Partitions the shard owns (learned from `Describe` or from its answers; empty until known).
    pub partitions: Mutex<Vec<u32>>,
    pub replicas: Arc<ReplicaGroup>,
}

/// Every shard the client asks.
pub struct ShardMap {
    pub groups: Vec<ShardGroup>,
}

impl ShardMap {
    pub fn start(
        groups: &[(Vec<u32>, Vec<String>)],
        tls: &ClientTls,
        probe: Duration,
    ) -> Result<Self, tonic::transport::Error> {
        let groups = groups
            .iter()
            .map(|(partitions, eps)| {
                Ok(ShardGroup {
                    partitions: Mutex::new(partitions.clone()),
                    replicas: ReplicaGroup::start(eps, tls, probe)?,
                })
            })
            .collect::<Result<_, tonic::transport::Error>>()?;
        Ok(Self { groups })
    }

    /// `(partitions, endpoints)` of every shard.
    pub fn layout(&self) -> Vec<(Vec<u32>, Vec<String>)> {
        self.groups.iter().map(|g| (g.partitions.lock().clone(), g.replicas.endpoints())).collect()
    }
}

/// What one endpoint said about itself.
#[derive(Clone, Debug)]
pub struct Described {
    pub endpoint: String,
    pub partitions: Vec<u32>,
    pub shard: u32,
    pub shard_count: u32,
    pub ready: bool,
}

/// Asks every endpoint what it serves (in parallel, each within `timeout`); endpoints that do
/// not answer are left out.
pub async fn describe_all(endpoints: &[String], tls: &ClientTls, timeout: Duration) -> Vec<Described> {
    let asks = endpoints.iter().map(|url| {
        let (url, tls) = (url.clone(), tls.clone());
        tokio::spawn(async move {
            let ch = crate::replicas::channel(&url, &tls).ok()?;
            let mut c = PrefixIndexClient::new(ch);
            let d =
                tokio::time::timeout(timeout, c.describe(DescribeRequest {})).await.ok()?.ok()?.into_inner();
            Some(Described {
                endpoint: url,
                partitions: d.partitions,
                shard: d.shard,
                shard_count: d.shard_count,
                ready: d.ready,
            })
        })
    });
    let mut out = Vec::new();
    for a in asks.collect::<Vec<_>>() {
        if let Ok(Some(d)) = a.await {
            out.push(d);
        }
    }
    out
}

/// The shards to ask: the finest sharding (largest shard count N) in which every shard
/// `0..N` has a ready replica — so a client moves to new, finer shards as soon as all of them
/// are ready, and stays on the old layout until then. Every endpoint of the chosen layout is
/// kept (readiness changes; each group prefers its ready replicas). `None` when no layout is
/// complete.
pub fn choose_layout(described: &[Described]) -> Option<Vec<(Vec<u32>, Vec<String>)>> {
    /// One shard of a layout: its partitions, endpoints, and whether any endpoint is ready.
    type Seen = (Vec<u32>, Vec<String>, bool);
    let mut by_count: BTreeMap<u32, BTreeMap<u32, Seen>> = BTreeMap::new();
    for d in described.iter().filter(|d| d.shard_count > 0) {
        let e = by_count
            .entry(d.shard_count)
            .or_default()
            .entry(d.shard)
            .or_insert_with(|| (d.partitions.clone(), vec![], false));
        e.1.push(d.endpoint.clone());
        e.2 |= d.ready;
    }
    let (_, shards) = by_count
        .into_iter()
        .rev()
        .find(|(n, shards)| shards.len() as u32 == *n && shards.values().all(|s| s.2))?;
    Some(shards.into_values().map(|(p, eps, _)| (p, eps)).collect())
}

/// One shard's reply to a query.
pub struct ShardReply {
    pub shard: usize,
    pub partitions: Vec<u32>,
    pub result: Result<(MatchResponse, String), Unavailable>,
}

/// The merged view of the shards' replies.
pub struct Merged {
    pub scores: Vec<WorkerScore>,
    pub applied: Vec<NextOffset>,
    pub replica_ids: Vec<String>,
    pub endpoints: Vec<String>,
    pub stale: bool,
    /// Shards that did not answer (indices into the map), and their partitions where known.
    pub missing_shards: Vec<usize>,
    pub missing_partitions: Vec<u32>,
    /// A worker reported by two shards (a protocol violation: a worker lives in one partition).
    pub duplicate_workers: usize,
}

/// Merges shard replies; `Err` (the most telling failure) only when no shard answered.
pub fn merge(replies: Vec<ShardReply>, top_k: Option<u32>) -> Result<Merged, Unavailable> {
    let mut m = Merged {
        scores: vec![],
        applied: vec![],
        replica_ids: vec![],
        endpoints: vec![],
        stale: false,
        missing_shards: vec![],
        missing_partitions: vec![],
        duplicate_workers: 0,
    };
    let mut best: BTreeMap<(u64, u32, u32), WorkerScore> = BTreeMap::new();
    let mut failures = Vec::new();
    for r in replies {
        match r.result {
            Ok((resp, endpoint)) => {
                for s in resp.scores {
                    let key = (s.worker, s.dp_rank, s.lane);
                    match best.get(&key) {
                        Some(old) => {
                            m.duplicate_workers += 1;
                            if s.depth > old.depth {
                                best.insert(key, s);
                            }
                        }
                        None => {
                            best.insert(key, s);
                        }
                    }
                }
                m.applied.extend(resp.applied.iter().map(|o| NextOffset::new(o.partition, o.offset)));
                m.replica_ids.push(resp.replica_id);
                m.endpoints.push(endpoint);
                m.stale |= resp.stale;
            }
            Err(e) => {
                m.missing_shards.push(r.shard);
                m.missing_partitions.extend(r.partitions);
                failures.push(e);
            }
        }
    }
    if m.replica_ids.is_empty() {
        return Err(most_telling(failures));
    }
    m.scores = best.into_values().collect();
    // The replicas' order: weighted score (0 without weights), depth, then the slot.
    m.scores.sort_by(|a, b| {
        (b.weighted_score, b.depth)
            .cmp(&(a.weighted_score, a.depth))
            .then((a.worker, a.dp_rank, a.lane).cmp(&(b.worker, b.dp_rank, b.lane)))
    });
    m.scores.truncate(top_k.map_or(usize::MAX, |k| k as usize));
    m.applied.sort_unstable();
    m.missing_partitions.sort_unstable();
    Ok(m)
}

/// A rejection says the most (fix the gateway), then a timeout, then the rest.
fn most_telling(failures: Vec<Unavailable>) -> Unavailable {
    let rank = |u: &Unavailable| match u {
        Unavailable::Rejected { .. } => 0,
        Unavailable::Timeout => 1,
        Unavailable::Overloaded(_) => 2,
        Unavailable::Disconnected(_) => 3,
    };
    failures.into_iter().min_by_key(rank).unwrap_or(Unavailable::Disconnected("no shards configured".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_proto::v1::PartitionOffset;

    fn d(ep: &str, shard: u32, n: u32, ready: bool) -> Described {
        let partitions = (0..4).filter(|p| n == 0 || p % n == shard).collect();
        Described { endpoint: ep.into(), partitions, shard, shard_count: n, ready }
    }

    #[test]
    fn the_finest_complete_and_ready_layout_wins() {
        let old = [d("a", 0, 1, true), d("b", 0, 1, true)];
        assert_eq!(choose_layout(&old).unwrap(), vec![(vec![0, 1, 2, 3], vec!["a".to_string(), "b".into()])]);
        // New shards not all ready yet: stay on the old layout.
        let mid = [old[0].clone(), old[1].clone(), d("s0", 0, 2, true), d("s1", 1, 2, false)];
        assert_eq!(choose_layout(&mid).unwrap().len(), 1);
        let done = [old[0].clone(), d("s0", 0, 2, true), d("s1", 1, 2, true), d("s1b", 1, 2, false)];
        let l = choose_layout(&done).unwrap();
        assert_eq!(
            l,
            vec![(vec![0, 2], vec!["s0".to_string()]), (vec![1, 3], vec!["s1".to_string(), "s1b".into()])]
        );
        assert!(choose_layout(&[d("s0", 0, 2, true)]).is_none(), "shard 1 of 2 missing");
    }

    fn score(worker: u64, depth: u32) -> WorkerScore {
        WorkerScore { worker, depth, total_blocks: depth, ..Default::default() }
    }

    fn reply(shard: usize, scores: Vec<WorkerScore>, part: u32) -> ShardReply {
        let resp = MatchResponse {
            scores,
            applied: vec![PartitionOffset { partition: part, offset: 10 }],
            replica_id: format!("r{shard}"),
            ..Default::default()
        };
        ShardReply { shard, partitions: vec![part], result: Ok((resp, format!("e{shard}"))) }
    }

    #[test]
    fn merge_is_a_union_cut_after_the_merge_and_flags_missing_shards() {
        let m = merge(
            vec![reply(0, vec![score(4, 3), score(2, 1)], 0), reply(1, vec![score(1, 3), score(3, 2)], 1)],
            Some(3),
        )
        .unwrap();
        let got: Vec<(u64, u32)> = m.scores.iter().map(|s| (s.worker, s.depth)).collect();
        assert_eq!(got, vec![(1, 3), (4, 3), (3, 2)]);
        assert_eq!(m.applied, vec![NextOffset::new(0, 10), NextOffset::new(1, 10)]);
        assert!(m.missing_shards.is_empty());
        let failed = ShardReply { shard: 1, partitions: vec![1, 3], result: Err(Unavailable::Timeout) };
        let m = merge(vec![reply(0, vec![score(4, 3)], 0), failed], None).unwrap();
        assert_eq!((m.missing_shards, m.missing_partitions), (vec![1], vec![1, 3]));
        let none = vec![ShardReply { shard: 0, partitions: vec![], result: Err(Unavailable::Timeout) }];
        assert_eq!(merge(none, None).err(), Some(Unavailable::Timeout));
    }
}

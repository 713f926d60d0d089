//! The demo's three gateway policies in the log, so that `audit loss` judges each: shared
//! index (the real fleet, keyspace `trace`), gateway-local guess (the shadow fleet, keyspace
//! `trace-local`) and round-robin (a third fleet of its own, keyspace `trace-round-robin`).
//! Each fleet's workers publish their KV events in their policy's keyspace, and each decision
//! is published as a placement naming its policy ([`Policy::name`]).
//!
//! The live side of the comparison, per decision ([`Judged`]): the contiguous prefix the
//! chosen worker held on any tier, and the most any worker of that fleet held — what the
//! audit computes from the log (unweighted, every worker eligible).
//!
//! The shadow fleets' workers have ids of their own ([`WorkerIds`]), placed on the partitions
//! the fewest workers use: the embedded broker keeps a few MiB per partition, and three fleets'
//! events on the real fleet's partitions would overflow it.
//!
//! The local and round-robin gateways ask no index: their placements carry, as the token, the
//! offsets every record published so far had landed at when the decision was made.

use super::offload::HostTier;
use super::Shared;
use prefixlog_engine::{partition_of, HolderKey, KeyspaceId};
use prefixlog_ingest::Publisher;
use prefixlog_state::record::{encode_kv_events, encode_placement_with_policy};
use prefixlog_state::{BlockHashes, KvOp, NextOffset};
use prefixlog_workload::Fleet;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A demo gateway policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    SharedIndex,
    LocalGuess,
    RoundRobin,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::SharedIndex, Policy::LocalGuess, Policy::RoundRobin];

    /// The name its placements carry.
    pub fn name(self) -> &'static str {
        match self {
            Policy::SharedIndex => "shared-index",
            Policy::LocalGuess => "gateway-local",
            Policy::RoundRobin => "round-robin",
        }
    }

    /// The keyspace of its fleet's records.
    pub fn keyspace(self) -> KeyspaceId {
        match self {
            Policy::SharedIndex => prefixlog::fleet_records::keyspace(),
            Policy::LocalGuess => KeyspaceId::new("trace-local", 64, 1),
            Policy::RoundRobin => KeyspaceId::new("trace-round-robin", 64, 1),
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// One decision as the live oracle saw it, in blocks on any tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Judged {
    pub chosen: u32,
    /// The prefix the chosen worker held.
    pub depth: u32,
    /// The most any worker of the fleet held.
    pub best: u32,
}

impl Judged {
    /// Before the chosen worker serves the request.
    pub fn of(fleet: &Fleet, host: &HostTier, chosen: u32, chain: &[BlockHashes]) -> Self {
        let depth = |w: u32| {
            let h = host.hit(fleet, w, chain);
            h.gpu + h.host
        };
        let best = (0..fleet.len() as u32).map(depth).max().unwrap_or(0);
        Judged { chosen, depth: depth(chosen), best }
    }

    pub fn lossy(&self) -> bool {
        self.depth < self.best
    }
}

/// The worker id in the log of every policy's fleet worker: the real fleet's are its indices;
/// each shadow worker gets an id on a partition as little used as possible.
#[derive(Clone, Debug)]
pub struct WorkerIds {
    ids: [Vec<u64>; 3],
}

impl WorkerIds {
    pub fn new(workers: usize, partitions: u32) -> Self {
        let n = partitions.max(1) as usize;
        let mut used = vec![0usize; n];
        let shared: Vec<u64> = (0..workers as u64).collect();
        for &w in &shared {
            used[partition_of(w, partitions) as usize] += 1;
        }
        let mut pick = |base: u64| {
            let least = *used.iter().min().expect("a partition");
            // fmix64 spreads consecutive ids over the partitions: a least-used one is met
            // within a few times `partitions` tries.
            let id =
                (base..).find(|&id| used[partition_of(id, partitions) as usize] == least).expect("an id");
            used[partition_of(id, partitions) as usize] += 1;
            id
        };
        let local = (0..workers as u64).map(|w| pick((1 << 40) + (w << 20))).collect();
        let rr = (0..workers as u64).map(|w| pick((2 << 40) + (w << 20))).collect();
        Self { ids: [shared, local, rr] }
    }

    /// The log's worker id of `policy`'s fleet worker `w`.
    pub fn id(&self, policy: Policy, w: u32) -> u64 {
        self.ids[policy.index()][w as usize]
    }
}

/// The round-robin fleet: request `i` goes to worker `i mod workers`.
pub struct RoundRobin {
    pub fleet: Fleet,
    pub host: HostTier,
}

impl RoundRobin {
    pub fn new(workers: usize, capacity: usize, host_capacity: usize) -> Self {
        Self { fleet: Fleet::new(workers, capacity), host: HostTier::new(workers, host_capacity) }
    }

    /// Routes request `i`: the decision as judged live, and the KV ops its serving caused.
    pub fn route(&mut self, i: usize, chain: &[BlockHashes]) -> (Judged, Vec<KvOp>) {
        let w = (i % self.fleet.len()) as u32;
        let judged = Judged::of(&self.fleet, &self.host, w, chain);
        (judged, self.host.serve(&mut self.fleet, w, chain))
    }
}

/// The shadow fleets' ordered KV-event queues, one per (policy, worker); `None` when the fleet
/// speaks SMG's protocol (the shadow fleets are then not published).
pub struct Feeds {
    ids: WorkerIds,
    partitions: u32,
    queues: Vec<Vec<mpsc::UnboundedSender<(u64, KvOp)>>>,
    seq: Vec<Vec<u64>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Feeds {
    /// Starts one publishing task per (shadow policy, worker).
    pub fn start(workers: usize, partitions: u32, publisher: &Publisher, s: &Arc<Shared>) -> Self {
        let ids = WorkerIds::new(workers, partitions);
        let (mut queues, mut seq, mut tasks) = (Vec::new(), Vec::new(), Vec::new());
        for policy in [Policy::LocalGuess, Policy::RoundRobin] {
            let mut qs = Vec::new();
            for w in 0..workers as u32 {
                let (tx, rx) = mpsc::unbounded_channel();
                let id = ids.id(policy, w);
                tasks.push(tokio::spawn(publish_events(
                    policy.keyspace(),
                    id,
                    rx,
                    publisher.clone(),
                    s.clone(),
                )));
                qs.push(tx);
            }
            queues.push(qs);
            seq.push(vec![0; workers]);
        }
        Self { ids, partitions, queues, seq, tasks }
    }

    /// Closes the queues and waits until every queued event is published.
    pub async fn close(self) -> Result<(), tokio::task::JoinError> {
        drop(self.queues);
        for t in self.tasks {
            t.await?;
        }
        Ok(())
    }

    /// Queues the ops of the local and the round-robin decision (their fleets' workers serving
    /// the request), in order; returns the placements to publish, with the token of what had
    /// landed just before.
    pub fn route(&mut self, s: &Shared, local: (u32, Vec<KvOp>), rr: (u32, Vec<KvOp>)) -> ShadowPlacements {
        let placements = [
            (Policy::LocalGuess, self.ids.id(Policy::LocalGuess, local.0)),
            (Policy::RoundRobin, self.ids.id(Policy::RoundRobin, rr.0)),
        ];
        let token = self.landed_token(s);
        self.send(Policy::LocalGuess, local.0, local.1);
        self.send(Policy::RoundRobin, rr.0, rr.1);
        ShadowPlacements { placements, token }
    }

    /// The offsets every record published so far had landed at, on every partition (0 where
    /// none had): a shadow policy's token.
    fn landed_token(&self, s: &Shared) -> Vec<NextOffset> {
        let landed = s.landed.lock();
        (0..self.partitions).map(|p| NextOffset::new(p, landed.get(&p).copied().unwrap_or(0))).collect()
    }

    /// Queues a shadow worker's ops, in order.
    fn send(&mut self, policy: Policy, worker: u32, ops: Vec<KvOp>) {
        let k = policy.index() - 1;
        for op in ops {
            let seq = &mut self.seq[k][worker as usize];
            *seq += 1;
            let _ = self.queues[k][worker as usize].send((*seq, op));
        }
    }
}

async fn publish_events(
    ks: KeyspaceId,
    w: u64,
    mut rx: mpsc::UnboundedReceiver<(u64, KvOp)>,
    p: Publisher,
    s: Arc<Shared>,
) {
    while let Some((seq, op)) = rx.recv().await {
        let v = encode_kv_events(&ks, w, 0, 1, seq, false, &[op]);
        match p.publish_raw(w, &v, None).await {
            Ok(l) => s.landed(l),
            Err(e) => tracing::warn!(worker = w, error = %e, "shadow worker could not publish its KV events"),
        }
    }
}

/// The shadow policies' placements of one request, `(policy, worker id)`, and their token.
pub struct ShadowPlacements {
    pub placements: [(Policy, u64); 2],
    pub token: Vec<NextOffset>,
}

/// Publishes a decision as a placement naming its policy; returns its token (partition, next
/// offset) when it landed.
#[allow(clippy::too_many_arguments)]
pub async fn place(
    publisher: &Publisher,
    policy: Policy,
    gateway: &str,
    worker_id: u64,
    locals: &[u64],
    token: &[NextOffset],
    s: &Shared,
) -> Option<NextOffset> {
    let holder = HolderKey::new(worker_id, 0, 0);
    let v = encode_placement_with_policy(&policy.keyspace(), holder, locals, token, gateway, policy.name());
    match publisher.publish_raw(holder.worker, &v, None).await {
        Ok(l) => {
            s.landed(l);
            Some(l.token())
        }
        Err(e) => {
            tracing::warn!(gateway, policy = policy.name(), error = %e, "placement not published");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// With room to spare, every shadow worker gets a partition of its own, none of the real
    /// fleet's; with none, the load stays even.
    #[test]
    fn shadow_workers_go_to_the_least_used_partitions() {
        let ids = WorkerIds::new(16, 64);
        let part = |p: Policy, w: u32| partition_of(ids.id(p, w), 64);
        let real: BTreeSet<u32> = (0..16).map(|w| part(Policy::SharedIndex, w)).collect();
        let shadow: Vec<u32> = [Policy::LocalGuess, Policy::RoundRobin]
            .iter()
            .flat_map(|&p| (0..16).map(move |w| part(p, w)))
            .collect();
        assert_eq!(shadow.iter().collect::<BTreeSet<_>>().len(), 32);
        assert!(shadow.iter().all(|p| !real.contains(p)));
        assert_eq!(ids.id(Policy::SharedIndex, 7), 7);
        let ids = WorkerIds::new(256, 64);
        let mut load = vec![0; 64];
        for p in Policy::ALL {
            for w in 0..256 {
                load[partition_of(ids.id(p, w), 64) as usize] += 1;
            }
        }
        let spread = load.iter().max().unwrap() - load.iter().min().unwrap();
        assert!(spread <= 10, "{load:?}");
    }

    #[test]
    fn judged_against_every_worker_of_the_fleet() {
        let mut fleet = Fleet::new(3, 100);
        let host = HostTier::new(3, 0);
        let chain = [(11, 1), (12, 2), (13, 3)].map(BlockHashes::from);
        fleet.serve(2, &chain);
        fleet.serve(1, &chain[..1]);
        let j = Judged::of(&fleet, &host, 1, &chain);
        assert_eq!((j.chosen, j.depth, j.best, j.lossy()), (1, 1, 3, true));
        assert!(!Judged::of(&fleet, &host, 2, &chain).lossy());
    }
}

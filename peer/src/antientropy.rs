//! Anti-entropy rounds: compare digest points with every peer, count, log, repair.

use crate::repair::{self_check, RepairContext, RepairOutcome};
use parking_lot::Mutex;
use prefixlog_ingest::Applier;
use prefixlog_proto::v1 as pb;
use prefixlog_proto::v1::replica_peer_client::ReplicaPeerClient;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Counters for metrics (`anti_entropy_*`).
#[derive(Default)]
pub struct AntiEntropyStats {
    pub rounds: AtomicU64,
    pub points_compared: AtomicU64,
    pub repairs: AtomicU64,
    /// Mismatches per partition.
    pub mismatches: Mutex<BTreeMap<u32, u64>>,
    /// Per peer: (unreachable count, last successful comparison, unix ms).
    pub peers: Mutex<BTreeMap<String, (u64, u64)>>,
}

impl AntiEntropyStats {
    pub fn mismatches_total(&self) -> u64 {
        self.mismatches.lock().values().sum()
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RoundReport {
    pub compared: u64,
    /// (peer, partition, next offset) where digests differ.
    pub mismatches: Vec<(String, u32, i64)>,
    pub repaired: Vec<u32>,
    pub unreachable: Vec<String>,
}

pub struct AntiEntropy {
    pub applier: Arc<Mutex<Applier>>,
    pub peers: Vec<String>,
    pub ctx: RepairContext,
    pub stats: Arc<AntiEntropyStats>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl AntiEntropy {
    /// Runs rounds forever, every `every`.
    pub async fn run(self, every: Duration) {
        let mut t = tokio::time::interval(every);
        loop {
            t.tick().await;
            self.round().await;
        }
    }

    /// One round against every peer.
    pub async fn round(&self) -> RoundReport {
        self.stats.rounds.fetch_add(1, Ordering::Relaxed);
        let mut report = RoundReport::default();
        for peer in &self.peers {
            match self.compare(peer, &mut report).await {
                Ok(()) => {
                    self.stats.peers.lock().entry(peer.clone()).or_default().1 = now_ms();
                }
                Err(e) => {
                    self.stats.peers.lock().entry(peer.clone()).or_default().0 += 1;
                    tracing::warn!(%peer, error = %e, "anti-entropy: peer unreachable (not a divergence)");
                    report.unreachable.push(peer.clone());
                }
            }
        }
        report
    }

    async fn compare(&self, peer: &str, report: &mut RoundReport) -> Result<(), String> {
        let url = if peer.contains("://") { peer.to_string() } else { format!("http://{peer}") };
        let endpoint = tonic::transport::Endpoint::from_shared(url)
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(2));
        let mut client = ReplicaPeerClient::new(endpoint.connect().await.map_err(|e| e.to_string())?);
        let theirs = client
            .digests(pb::DigestsRequest { partitions: vec![] })
            .await
            .map_err(|s| s.to_string())?
            .into_inner();
        // (partition, first mismatching offset, our digest there, last agreed offset)
        let mut todo = Vec::new();
        {
            let a = self.applier.lock();
            for pd in &theirs.partitions {
                if pd.partition >= a.config().partitions {
                    continue;
                }
                let ours: BTreeMap<i64, u64> =
                    a.digest_points(pd.partition).map(|d| (d.next_offset, d.digest)).collect();
                let mut agreed = None;
                let mut first_bad = None;
                for pt in &pd.points {
                    let Some(&mine) = ours.get(&pt.next_offset) else { continue };
                    report.compared += 1;
                    if mine == pt.digest {
                        if first_bad.is_none() {
                            agreed = Some(pt.next_offset);
                        }
                    } else if first_bad.is_none() {
                        first_bad = Some((pt.next_offset, mine));
                    }
                }
                if let Some((off, mine)) = first_bad {
                    report.mismatches.push((peer.to_string(), pd.partition, off));
                    todo.push((pd.partition, off, mine, agreed));
                }
            }
        }
        self.stats.points_compared.fetch_add(report.compared, Ordering::Relaxed);
        for (p, off, mine, agreed) in todo {
            *self.stats.mismatches.lock().entry(p).or_default() += 1;
            let differing = self.differing_holders(&mut client, p).await;
            tracing::error!(
                %peer, partition = p, offset = off, last_agreed = ?agreed, holders = ?differing,
                "anti-entropy: digest mismatch (a bug or corruption); self-checking this replica"
            );
            let (applier, ctx) = (self.applier.clone(), self.ctx.clone());
            let outcome =
                tokio::task::spawn_blocking(move || self_check(&applier, &ctx, p, off, mine, agreed))
                    .await
                    .map_err(|e| e.to_string())?;
            match outcome {
                Ok(RepairOutcome::Consistent) => {
                    tracing::warn!(
                        partition = p,
                        "self-check: this replica matches its log; the peer must repair"
                    )
                }
                Ok(RepairOutcome::Repaired { from_checkpoint, replayed_to }) => {
                    self.stats.repairs.fetch_add(1, Ordering::Relaxed);
                    report.repaired.push(p);
                    tracing::warn!(
                        partition = p,
                        ?from_checkpoint,
                        replayed_to,
                        "self-check: diverged; partition rebuilt and swapped in"
                    );
                }
                Err(e) => {
                    tracing::error!(partition = p, error = %e, "self-check failed; will retry next round")
                }
            }
        }
        Ok(())
    }

    /// Holders whose (blocks, digest) differ from the peer's now (offsets may differ slightly,
    /// so this is a lead for the log, not a verdict).
    async fn differing_holders(
        &self,
        client: &mut ReplicaPeerClient<tonic::transport::Channel>,
        p: u32,
    ) -> Vec<String> {
        let Ok(theirs) = client.holder_digests(pb::HolderDigestsRequest { partition: p }).await else {
            return vec![];
        };
        let theirs = theirs.into_inner();
        let key = |k: &Option<pb::Keyspace>, w: u64, d: u32, l: u32| {
            let k = k.clone().unwrap_or_default();
            format!("{}/bs{}/s{} worker {w} dp {d} lane {l}", k.model, k.block_size, k.hash_scheme)
        };
        let mut map: BTreeMap<String, (u32, u64)> = theirs
            .holders
            .iter()
            .map(|h| (key(&h.keyspace, h.worker, h.dp_rank, h.lane), (h.blocks, h.digest)))
            .collect();
        let mut out = Vec::new();
        let a = self.applier.lock();
        let n = a.config().partitions;
        for ks in a.engine().keyspaces() {
            let g = ks.read();
            let id = g.id().clone();
            for h in g
                .holder_summaries()
                .into_iter()
                .filter(|h| prefixlog_engine::partition_of(h.key.worker, n) == p)
            {
                let k = key(
                    &Some(pb::Keyspace {
                        model: id.model.clone(),
                        block_size: id.block_size,
                        hash_scheme: id.scheme,
                    }),
                    h.key.worker,
                    h.key.dp_rank,
                    h.key.lane,
                );
                if map.remove(&k) != Some((h.blocks, h.digest)) {
                    out.push(k);
                }
            }
        }
        out.extend(map.into_keys());
        out.truncate(20);
        out
    }
}

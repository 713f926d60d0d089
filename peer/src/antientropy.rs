//! Anti-entropy rounds: compare digest points with every peer, count, log, repair.
//!
//! A round first compares identities with the one compatibility rule: a peer of another log
//! (cluster, topic, partition count) or with other state settings is reported as such — its
//! own outcome, metric and log line — and never compared digest by digest (different settings
//! give different states from the same log, so every point would "mismatch" and every round
//! would repair). Only partitions both replicas own are compared.

use crate::bootstrap::connect;
use crate::repair::{check_and_repair, RepairContext, RepairOutcome};
use prefixlog_ingest::{check_compatible, Incompatible, LogIdentity, Replica, StateSettings};
use prefixlog_proto::v1 as pb;
use prefixlog_proto::v1::replica_peer_client::ReplicaPeerClient;
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Anti-entropy metrics (`prefixlog_anti_entropy_*`).
pub struct AntiEntropyStats {
    pub rounds: IntCounter,
    pub points_compared: IntCounter,
    pub repairs: IntCounter,
    /// Mismatches per partition.
    pub mismatches: IntCounterVec,
    /// Rounds in which a peer could not be reached, per peer.
    pub unreachable: IntCounterVec,
    /// Rounds in which a peer's state settings (or log) differed from ours, per peer.
    pub incompatible: IntCounterVec,
    /// Unix time of the last successful comparison, per peer.
    pub last_success: IntGaugeVec,
}

impl AntiEntropyStats {
    pub fn new() -> Self {
        let c = |n: &str, h: &str| IntCounter::new(n, h).expect("valid metric");
        let v = |n: &str, h: &str, l: &str| IntCounterVec::new(Opts::new(n, h), &[l]).expect("valid metric");
        Self {
            rounds: c("prefixlog_anti_entropy_rounds_total", "Anti-entropy rounds run"),
            points_compared: c("prefixlog_anti_entropy_points_compared_total", "Digest points compared"),
            repairs: c(
                "prefixlog_anti_entropy_repairs_total",
                "Partitions rebuilt and swapped in after a failed self-check",
            ),
            mismatches: v(
                "prefixlog_anti_entropy_mismatches_total",
                "Digest mismatches found, per partition",
                "partition",
            ),
            unreachable: v(
                "prefixlog_anti_entropy_peer_unreachable_total",
                "Rounds in which a peer could not be reached",
                "peer",
            ),
            incompatible: v(
                "prefixlog_anti_entropy_incompatible_total",
                "Rounds in which a peer was not compared: other state settings or another log (label reason)",
                "reason",
            ),
            last_success: IntGaugeVec::new(
                Opts::new(
                    "prefixlog_anti_entropy_last_success_timestamp_seconds",
                    "Last successful comparison with a peer",
                ),
                &["peer"],
            )
            .expect("valid metric"),
        }
    }

    /// Starts every known series at 0, so alerts and dashboards see them before the first
    /// event (an absent series and a zero one differ to Prometheus).
    pub fn init(&self, peers: &[String], partitions: &[u32]) {
        for p in partitions {
            self.mismatches.with_label_values(&[p.to_string().as_str()]);
        }
        for peer in peers {
            self.unreachable.with_label_values(&[peer.as_str()]);
        }
        for reason in ["settings_differ", "another_log"] {
            self.incompatible.with_label_values(&[reason]);
        }
    }

    pub fn register(&self, r: &Registry) -> prometheus::Result<()> {
        r.register(Box::new(self.rounds.clone()))?;
        r.register(Box::new(self.points_compared.clone()))?;
        r.register(Box::new(self.repairs.clone()))?;
        r.register(Box::new(self.mismatches.clone()))?;
        r.register(Box::new(self.unreachable.clone()))?;
        r.register(Box::new(self.incompatible.clone()))?;
        r.register(Box::new(self.last_success.clone()))
    }

    pub fn mismatches_total(&self) -> u64 {
        use prometheus::core::Collector;
        self.mismatches
            .collect()
            .iter()
            .flat_map(|f| f.get_metric().iter().map(|m| m.get_counter().value() as u64))
            .sum()
    }
}

impl Default for AntiEntropyStats {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RoundReport {
    pub compared: u64,
    /// (peer, partition, next offset) where digests differ.
    pub mismatches: Vec<(String, u32, i64)>,
    pub repaired: Vec<u32>,
    pub unreachable: Vec<String>,
    /// Peers not compared, and why (other settings, another log).
    pub incompatible: Vec<(String, Incompatible)>,
}

pub struct AntiEntropy {
    pub replica: Arc<Replica>,
    pub peers: Vec<String>,
    pub ctx: RepairContext,
    pub stats: Arc<AntiEntropyStats>,
    /// Mutual TLS to peers, when the peer port requires it.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// The peer's identity as its `Digests` reply states it.
fn peer_identity(d: &pb::DigestsResponse) -> Result<LogIdentity, String> {
    let settings = StateSettings::decode(&d.settings).map_err(|e| e.to_string())?;
    Ok(LogIdentity {
        cluster_id: d.cluster_id.clone(),
        topic: d.topic.clone(),
        partitions: d.partition_count,
        owned: d.owned_partitions.clone(),
        settings,
    })
}

/// (partition, first mismatching offset, our digest there, last agreed offset)
type Mismatch = (u32, i64, u64, Option<i64>);

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
        self.stats.rounds.inc();
        let mut report = RoundReport::default();
        for peer in &self.peers {
            match self.compare(peer, &mut report).await {
                Ok(()) => self.stats.last_success.with_label_values(&[peer.as_str()]).set(now_s()),
                Err(e) => {
                    self.stats.unreachable.with_label_values(&[peer.as_str()]).inc();
                    tracing::warn!(%peer, error = %e, "anti-entropy: peer unreachable (not a divergence)");
                    report.unreachable.push(peer.clone());
                }
            }
        }
        report
    }

    async fn compare(&self, peer: &str, report: &mut RoundReport) -> Result<(), String> {
        let mut client = connect(peer, self.tls.as_ref()).await.map_err(|e| e.to_string())?;
        let theirs = client
            .digests(pb::DigestsRequest { partitions: vec![] })
            .await
            .map_err(|s| s.to_string())?
            .into_inner();
        let their_id = peer_identity(&theirs)?;
        let ours = &self.ctx.identity;
        let common: Vec<u32> =
            ours.owned.iter().copied().filter(|p| their_id.owned.binary_search(p).is_ok()).collect();
        if let Err(why) = check_compatible(ours, &their_id, &common) {
            let reason = match why {
                Incompatible::Settings { .. } => "settings_differ",
                _ => "another_log",
            };
            self.stats.incompatible.with_label_values(&[reason]).inc();
            tracing::error!(%peer, %why, "anti-entropy: peer not compared: {why}");
            report.incompatible.push((peer.to_string(), why));
            return Ok(());
        }
        let todo = self.mismatches(&theirs, &common, peer, report);
        for (p, off, mine, agreed) in todo {
            self.on_mismatch(&mut client, peer, p, off, mine, agreed, report).await;
        }
        Ok(())
    }

    /// Compares the points both replicas have, for partitions both own.
    fn mismatches(
        &self,
        theirs: &pb::DigestsResponse,
        common: &[u32],
        peer: &str,
        report: &mut RoundReport,
    ) -> Vec<Mismatch> {
        let mut todo = Vec::new();
        let a = self.replica.applier().lock();
        for pd in theirs.partitions.iter().filter(|pd| common.binary_search(&pd.partition).is_ok()) {
            let ours: BTreeMap<i64, u64> =
                a.digest_points(pd.partition).map(|d| (d.next_offset, d.digest)).collect();
            let (mut agreed, mut first_bad) = (None, None);
            for pt in &pd.points {
                let Some(&mine) = ours.get(&pt.next_offset) else { continue };
                report.compared += 1;
                if mine != pt.digest {
                    first_bad = first_bad.or(Some((pt.next_offset, mine)));
                } else if first_bad.is_none() {
                    agreed = Some(pt.next_offset);
                }
            }
            if let Some((off, mine)) = first_bad {
                report.mismatches.push((peer.to_string(), pd.partition, off));
                todo.push((pd.partition, off, mine, agreed));
            }
        }
        self.stats.points_compared.inc_by(report.compared);
        todo
    }

    #[allow(clippy::too_many_arguments)]
    async fn on_mismatch(
        &self,
        client: &mut ReplicaPeerClient<tonic::transport::Channel>,
        peer: &str,
        p: u32,
        off: i64,
        mine: u64,
        agreed: Option<i64>,
        report: &mut RoundReport,
    ) {
        self.stats.mismatches.with_label_values(&[&p.to_string()]).inc();
        let differing = crate::holders::differing_holders(client, &self.replica, &self.ctx.identity, p).await;
        tracing::error!(
            %peer, partition = p, offset = off, last_agreed = ?agreed, holders = ?differing,
            "anti-entropy: digest mismatch (a bug or corruption); self-checking this replica"
        );
        match check_and_repair(&self.ctx, &self.replica, p, off, mine, agreed).await {
            Ok(RepairOutcome::Consistent) => {
                tracing::warn!(
                    partition = p,
                    "self-check: this replica matches its log; the peer must repair"
                )
            }
            Ok(RepairOutcome::Repaired { from_checkpoint, swapped_at }) => {
                self.stats.repairs.inc();
                report.repaired.push(p);
                tracing::warn!(
                    partition = p,
                    ?from_checkpoint,
                    swapped_at,
                    "self-check: diverged; partition rebuilt and swapped in"
                );
            }
            Err(e) => tracing::error!(partition = p, error = %e, "self-check failed; will retry next round"),
        }
    }
}

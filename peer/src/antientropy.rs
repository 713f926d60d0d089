//! Anti-entropy rounds: compare digest points with every peer, count, log, repair.
//!
//! A round asks every peer at once, each on its own task and each call under the
//! [`PeerClient`]'s deadline, so one slow or hung peer is reported unreachable when its
//! deadline passes and delays no comparison with the others.
//!
//! A round first compares identities with the one compatibility rule: a peer of another log
//! (cluster, topic, partition count) or with other state settings is reported as such — its
//! own outcome, metric and log line — and never compared digest by digest (different settings
//! give different states from the same log, so every point would "mismatch" and every round
//! would repair). Only partitions both replicas own are compared.

use crate::client::{CallError, PeerClient};
use crate::repair::{check_and_repair, RepairContext, RepairOutcome};
use prefixlog_proto::v1 as pb;
use prefixlog_proto::v1::replica_peer_client::ReplicaPeerClient;
use prefixlog_state::settings::SettingsError;
use prefixlog_state::LiveState;
use prefixlog_state::{check_compatible, Incompatible, LogIdentity, StateSettings};
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

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
    pub replica: Arc<dyn LiveState>,
    pub peers: Vec<String>,
    pub ctx: RepairContext,
    pub stats: Arc<AntiEntropyStats>,
    /// How peers are called: TLS, deadlines, size caps.
    pub client: PeerClient,
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Why a peer was not compared this round (counted as unreachable, not as a divergence).
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("peer {peer}: its digests reply: {source}")]
    Settings {
        peer: String,
        #[source]
        source: SettingsError,
    },
}

/// The peer's identity as its `Digests` reply states it.
fn peer_identity(peer: &str, d: &pb::DigestsResponse) -> Result<LogIdentity, CompareError> {
    let settings = StateSettings::decode(&d.settings)
        .map_err(|source| CompareError::Settings { peer: peer.into(), source })?;
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

impl RoundReport {
    fn merge(&mut self, other: RoundReport) {
        self.compared += other.compared;
        self.mismatches.extend(other.mismatches);
        self.repaired.extend(other.repaired);
        self.unreachable.extend(other.unreachable);
        self.incompatible.extend(other.incompatible);
    }
}

impl AntiEntropy {
    /// Runs rounds forever, every `every` (a round that outlasts it delays the next).
    pub async fn run(self: Arc<Self>, every: Duration) {
        let mut t = tokio::time::interval(every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            t.tick().await;
            self.round().await;
        }
    }

    /// One round against every peer, all at once; the report lists peers in `peers` order.
    pub async fn round(self: &Arc<Self>) -> RoundReport {
        self.stats.rounds.inc();
        let mut tasks = JoinSet::new();
        for (i, peer) in self.peers.iter().enumerate() {
            let (me, peer) = (self.clone(), peer.clone());
            tasks.spawn(async move {
                let mut r = RoundReport::default();
                let outcome = me.compare(&peer, &mut r).await;
                (i, peer, outcome, r)
            });
        }
        let mut done = Vec::with_capacity(self.peers.len());
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(x) => done.push(x),
                Err(e) => tracing::error!(error = %e, "anti-entropy: a comparison task failed (a bug)"),
            }
        }
        done.sort_by_key(|d| d.0);
        let mut report = RoundReport::default();
        for (_, peer, outcome, r) in done {
            report.merge(r);
            match outcome {
                Ok(()) => self.stats.last_success.with_label_values(&[peer.as_str()]).set(now_s()),
                Err(e) => {
                    self.stats.unreachable.with_label_values(&[peer.as_str()]).inc();
                    tracing::warn!(%peer, error = %e, "anti-entropy: peer unreachable (not a divergence)");
                    report.unreachable.push(peer);
                }
            }
        }
        self.stats.points_compared.inc_by(report.compared);
        report
    }

    async fn compare(&self, peer: &str, report: &mut RoundReport) -> Result<(), CompareError> {
        let mut client = self.client.connect(peer).await?;
        let req = pb::DigestsRequest { partitions: vec![] };
        let theirs = self
            .client
            .deadline(peer, "asking for digests", client.digests(req))
            .await?
            .map_err(|s| CallError::rpc(peer, s))?
            .into_inner();
        let their_id = peer_identity(peer, &theirs)?;
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
        let lead = crate::holders::differing_holders(client, &*self.replica, &self.ctx.identity, p);
        let differing =
            self.client.deadline(peer, "asking for holder digests", lead).await.unwrap_or_default();
        tracing::error!(
            %peer, partition = p, offset = off, last_agreed = ?agreed, holders = ?differing,
            "anti-entropy: digest mismatch (a bug or corruption); self-checking this replica"
        );
        match check_and_repair(&self.ctx, &*self.replica, p, off, mine, agreed).await {
            Ok(RepairOutcome::Consistent) => {
                tracing::warn!(
                    partition = p,
                    "self-check: this replica matches its log; the peer must repair"
                )
            }
            Ok(RepairOutcome::AlreadyRunning) => {
                tracing::info!(partition = p, "self-check: a repair of this partition is already running")
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

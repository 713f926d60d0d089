//! Recovering partitions the log no longer continues, from a peer's checkpoint.
//!
//! At start ([`crate::startup`]) and at run time: the ingest thread halts a partition on a
//! discontinuity (an offset deleted by retention before it was read, a gap, a recreated
//! topic); this task then fetches, from each peer in turn, a checkpoint of just that partition,
//! keeps it only if the log continues *its* offset, and has the ingest thread swap it in and
//! read on from there. Until then the partition stays discontinuous and the replica not ready.
//!
//! A partition halted before a hole inside the log (offsets the reader is given no record at:
//! a transactional producer's markers or aborted records) takes only a state that ends past
//! the hole: one that ends before it would read up to the same hole and halt again, forever
//! (recover, meet the hole, recover...). When no peer has such a state, the partition stays
//! halted and recovery asks again only every [`BEFORE_HOLE_RETRY`].

use crate::error::NodeError;
use crate::ingest_thread::IngestThread;
use prefixlog_ingest::continuity::{check_marks, check_offsets, OffsetProblem};
use prefixlog_ingest::{probe_log, LogSpec};
use prefixlog_peer::PeerClient;
use prefixlog_snapshot::restore_for;
use prefixlog_state::LogProbe;
use prefixlog_state::NextOffset;
use prefixlog_state::{Applier, LogIdentity};
use prometheus::IntCounterVec;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long reading back the records a state's fingerprints name may take.
const MARK_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a failed recovery waits before it asks the peers again.
const RETRY: Duration = Duration::from_secs(10);

/// How long a recovery waits when every peer's state ended before the partition's hole: a peer
/// only gets past it when an operator lets it (`--accept-log-gaps`).
const BEFORE_HOLE_RETRY: Duration = Duration::from_secs(300);

/// What one recovery attempt came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Recovery {
    Recovered,
    Failed,
    /// Every peer that had a state of the partition had one that ends before its hole.
    BeforeHole,
}

/// The partitions of `applier` (among `need`) the log does not continue: offsets outside the
/// retained range ([`check_offsets`]), then, for the others, a record before the offset that
/// is not the one the state applied ([`check_marks`]: the topic was recreated and refilled).
pub async fn not_continued(
    spec: &LogSpec,
    applier: &Applier,
    need: &[u32],
    probe: &LogProbe,
) -> Result<Vec<OffsetProblem>, NodeError> {
    let mut problems =
        check_offsets(need.iter().map(|&p| NextOffset::new(p, applier.partition(p).next_offset)), probe);
    let marks: Vec<(u32, i64, u64)> = need
        .iter()
        .filter(|&&p| problems.iter().all(|x| x.partition() != p))
        .map(|&p| (p, applier.partition(p).next_offset, applier.partition(p).last_mark))
        .collect();
    let (spec, probe) = (spec.clone(), probe.clone());
    let replaced =
        tokio::task::spawn_blocking(move || check_marks(&spec, &marks, &probe, MARK_CHECK_TIMEOUT)).await??;
    problems.extend(replaced);
    Ok(problems)
}

/// A peer's checkpoint of `need` partitions, restored, if the log continues it.
pub async fn fetch_continued(
    spec: &LogSpec,
    peer: &str,
    client: &PeerClient,
    identity: &LogIdentity,
    need: &[u32],
    probe: &LogProbe,
) -> Result<Applier, NodeError> {
    let loaded = client.fetch_checkpoint(peer, identity, need).await?;
    let state = restore_for(&loaded, identity, need)?;
    if let Some(problem) = not_continued(spec, &state, need, probe).await?.into_iter().next() {
        return Err(NodeError::PeerNotContinued { peer: peer.to_string(), problem });
    }
    Ok(state)
}

/// Where recovery fetches from, and how.
pub struct Sources {
    pub peers: Vec<String>,
    pub client: PeerClient,
}

/// Watches for discontinuous partitions and recovers them from `sources`, forever.
pub async fn run(
    spec: LogSpec,
    identity: LogIdentity,
    sources: Sources,
    replica: Arc<IngestThread>,
    recoveries: IntCounterVec,
) {
    let mut retry_at: BTreeMap<u32, Instant> = BTreeMap::new();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let due: Vec<u32> = replica
            .status()
            .discontinuous()
            .into_iter()
            .filter(|p| retry_at.get(p).is_none_or(|t| Instant::now() >= *t))
            .collect();
        for p in due {
            let outcome = recover(&spec, &identity, &sources, &replica, p).await;
            let recovered = outcome == Recovery::Recovered;
            recoveries.with_label_values(&[if recovered { "recovered" } else { "failed" }]).inc();
            match outcome {
                Recovery::Recovered => retry_at.remove(&p),
                Recovery::Failed => retry_at.insert(p, Instant::now() + RETRY),
                Recovery::BeforeHole => retry_at.insert(p, Instant::now() + BEFORE_HOLE_RETRY),
            };
        }
    }
}

async fn recover(
    spec: &LogSpec,
    identity: &LogIdentity,
    sources: &Sources,
    replica: &IngestThread,
    p: u32,
) -> Recovery {
    let probe = {
        let spec = spec.clone();
        match tokio::task::spawn_blocking(move || probe_log(&spec)).await {
            Ok(Ok(probe)) => probe,
            Ok(Err(e)) => {
                tracing::warn!(partition = p, error = %e, "recovery: cannot probe the log; will retry");
                return Recovery::Failed;
            }
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "recovery: probe task failed");
                return Recovery::Failed;
            }
        }
    };
    let hole = replica.status().hole(p);
    let mut before_hole = false;
    for peer in &sources.peers {
        match fetch_continued(spec, peer, &sources.client, identity, &[p], &probe).await {
            Ok(state) => {
                let at = state.partition(p).next_offset;
                if let Some(h) = hole.filter(|h| at < h.end) {
                    tracing::warn!(
                        partition = p,
                        %peer,
                        at,
                        "recovery: the peer's state ends at offset {at}, before the hole that halted the \
                         partition ({h}); it would meet the same hole again: not swapped in"
                    );
                    before_hole = true;
                    continue;
                }
                match replica.replace_partition(p, state).await {
                    Ok(()) => {
                        tracing::warn!(partition = p, %peer, at, "recovered the partition from the peer's checkpoint");
                        return Recovery::Recovered;
                    }
                    Err(e) => {
                        tracing::error!(partition = p, error = %e, "recovery: swapping the state in failed")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(partition = p, %peer, error = %e, "recovery: this peer cannot provide the partition")
            }
        }
    }
    if before_hole {
        tracing::error!(
            partition = p,
            retry_in = ?BEFORE_HOLE_RETRY,
            "recovery: every peer's state ends before the hole in the log; the partition stays halted \
             (docs/operations.md, runbook \"log hole\")"
        );
        return Recovery::BeforeHole;
    }
    tracing::error!(
        partition = p,
        "recovery: no peer could provide a state the log continues; the partition stays halted"
    );
    Recovery::Failed
}

//! Recovering partitions the log no longer continues, from a peer's checkpoint.
//!
//! At start ([`crate::startup`]) and at run time: the ingest thread halts a partition on a
//! discontinuity (an offset deleted by retention before it was read, a gap, a recreated
//! topic); this task then fetches, from each peer in turn, a checkpoint of just that partition,
//! keeps it only if the log continues *its* offset, and has the ingest thread swap it in and
//! read on from there. Until then the partition stays discontinuous and the replica not ready.

use crate::error::NodeError;
use prefixlog_ingest::continuity::check_offsets;
use prefixlog_ingest::{probe_log, Applier, LogIdentity, LogProbe, LogSpec, Replica};
use prefixlog_snapshot::restore_for;
use prometheus::IntCounterVec;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::ClientTlsConfig;

/// A peer's checkpoint of `need` partitions, restored, if the log continues its offsets.
pub async fn fetch_continued(
    peer: &str,
    tls: Option<&ClientTlsConfig>,
    identity: &LogIdentity,
    need: &[u32],
    probe: &LogProbe,
) -> Result<Applier, NodeError> {
    let loaded = prefixlog_peer::fetch_checkpoint(peer, tls, identity, need).await?;
    let offsets: Vec<(u32, i64)> = need.iter().map(|&p| (p, loaded.meta.offsets[p as usize])).collect();
    if let Some(problem) = check_offsets(offsets, probe).into_iter().next() {
        return Err(NodeError::PeerNotContinued { peer: peer.to_string(), problem });
    }
    Ok(restore_for(&loaded, identity, need)?)
}

/// Where recovery fetches from, and how.
pub struct Sources {
    pub peers: Vec<String>,
    pub tls: Option<ClientTlsConfig>,
}

/// Watches for discontinuous partitions and recovers them from `sources`, forever.
pub async fn run(
    spec: LogSpec,
    identity: LogIdentity,
    sources: Sources,
    replica: Arc<Replica>,
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
            recoveries.with_label_values(&[if outcome { "recovered" } else { "failed" }]).inc();
            if outcome {
                retry_at.remove(&p);
            } else {
                retry_at.insert(p, Instant::now() + Duration::from_secs(10));
            }
        }
    }
}

async fn recover(
    spec: &LogSpec,
    identity: &LogIdentity,
    sources: &Sources,
    replica: &Replica,
    p: u32,
) -> bool {
    let probe = {
        let spec = spec.clone();
        match tokio::task::spawn_blocking(move || probe_log(&spec)).await {
            Ok(Ok(probe)) => probe,
            Ok(Err(e)) => {
                tracing::warn!(partition = p, error = %e, "recovery: cannot probe the log; will retry");
                return false;
            }
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "recovery: probe task failed");
                return false;
            }
        }
    };
    for peer in &sources.peers {
        match fetch_continued(peer, sources.tls.as_ref(), identity, &[p], &probe).await {
            Ok(state) => {
                let at = state.partition(p).next_offset;
                match replica.replace_partition(p, state).await {
                    Ok(()) => {
                        tracing::warn!(partition = p, %peer, at, "recovered the partition from the peer's checkpoint");
                        return true;
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
    tracing::error!(
        partition = p,
        "recovery: no peer could provide a state the log continues; the partition stays halted"
    );
    false
}

//! Choosing the state a replica starts from, and proving the log continues it.
//!
//! In order: the newest local checkpoint that can stand for this replica (the one
//! compatibility rule); else, with `bootstrap_from`, a peer's; else the empty state at offset
//! 0. Then every owned partition's offset is checked against the log's retained range
//! ([`prefixlog_ingest::continuity`]). A partition the log does not continue is replaced from a
//! peer's checkpoint the log does continue (`bootstrap_from`, then `peers`); failing that the
//! replica refuses to start — naming the partitions, the offsets and the remedies — unless the
//! operator opted into starting with those partitions' holders marked gapped.

use crate::error::NodeError;
use crate::options::{GapChoice, NodeOptions, SettingsChange};
use crate::progress::{Phase, StartupProgress};
use crate::recovery::not_continued;
use prefixlog_ingest::continuity::OffsetProblem;
use prefixlog_ingest::{
    check_compatible, cleanup_policy, probe_log, Applier, CleanupPolicy, Incompatible, LogIdentity, LogProbe,
    LogSpec,
};
use prefixlog_snapshot::{newest_usable, restore_for, CheckpointStore, Loaded};
use std::sync::Arc;

/// Where the starting state came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateSource {
    LocalCheckpoint(u64),
    Peer { peer: String, checkpoint: u64 },
    LogStart,
}

pub struct Prepared {
    pub applier: Applier,
    pub identity: LogIdentity,
    pub probe: LogProbe,
    pub store: Option<Arc<CheckpointStore>>,
    pub source: StateSource,
    /// Next offsets the state on disk covers (what the checkpoint loop measures progress from).
    pub covered: Vec<i64>,
}

/// Every step is reported to `progress` (the admin port's `/metrics` and `/readyz` meanwhile).
pub async fn prepare(
    spec: &LogSpec,
    opts: &NodeOptions,
    progress: &StartupProgress,
) -> Result<Prepared, NodeError> {
    progress.enter(Phase::ProbingLog);
    spec.settings.validate()?;
    let probe = {
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || probe_log(&spec)).await.map_err(NodeError::task)??
    };
    check_cleanup_policy(spec).await?;
    let identity = LogIdentity {
        cluster_id: probe.cluster_id.clone(),
        topic: spec.topic.clone(),
        partitions: spec.partitions,
        owned: spec.owned().to_vec(),
        settings: spec.settings,
    };
    let store = open_store(opts)?;
    let (loaded, source) = initial_checkpoint(spec, opts, &identity, store.as_deref(), progress).await?;
    let (mut applier, covered) = match &loaded {
        Some(l) => {
            progress.enter(Phase::Restoring);
            let t = std::time::Instant::now();
            let applier = restore_for(l, &identity, spec.owned())?;
            let (hb, secs) = (l.meta.holder_blocks(), t.elapsed().as_secs_f64());
            tracing::info!(
                checkpoint = l.meta.id,
                holder_blocks = hb,
                secs,
                holder_blocks_per_s = (hb as f64 / secs.max(1e-9)) as u64,
                "restored; replaying the tail from the checkpoint's offsets"
            );
            (applier, l.meta.offsets.clone())
        }
        None => (Applier::new(spec.partitions, spec.settings), vec![0; spec.partitions as usize]),
    };
    if store.is_none() {
        tracing::warn!("no data dir: no checkpoints; every start replays the whole log");
    }
    progress.enter(Phase::ProvingContinuity);
    prove_continuity(spec, opts, &identity, &probe, &mut applier).await?;
    if opts.query_copy {
        // Before anything else holds the engine: keyspaces handed out earlier keep one copy.
        applier.engine().keep_query_copies();
        tracing::info!("query copy on: two copies of every keyspace, queries never wait on a write");
    }
    Ok(Prepared { applier, identity, probe, store, source, covered })
}

/// The topic must not be compacted: compaction drops a worker's earlier records, which a
/// replica would never notice offset by offset (Kafka keeps compacted offsets sparse).
async fn check_cleanup_policy(spec: &LogSpec) -> Result<(), NodeError> {
    match cleanup_policy(spec).await {
        CleanupPolicy::Delete => Ok(()),
        CleanupPolicy::Compacted(policy) => {
            Err(NodeError::CompactedTopic { topic: spec.topic.clone(), policy })
        }
        CleanupPolicy::Unknown(why) => {
            tracing::info!(topic = %spec.topic, %why, "could not check the topic's cleanup.policy (it must be delete, never compact)");
            Ok(())
        }
    }
}

fn open_store(opts: &NodeOptions) -> Result<Option<Arc<CheckpointStore>>, NodeError> {
    let Some(dir) = &opts.data_dir else { return Ok(None) };
    std::fs::create_dir_all(dir).map_err(|e| NodeError::DataDir { dir: dir.clone(), source: e })?;
    let store = CheckpointStore::open(&dir.join("checkpoints"))
        .map_err(|e| NodeError::Store { dir: dir.clone(), source: e })?;
    Ok(Some(Arc::new(store)))
}

/// The newest local checkpoint of the same log, when its settings differ from ours: the
/// operator changed a state-deciding setting since it was written. Older checkpoints do not
/// count: after a replay with new settings (`--replay-on-settings-change`) the retention keeps
/// checkpoints of the old ones for a while, and a later restart must restore the new state,
/// not refuse because of them.
fn settings_changed(store: &CheckpointStore, ours: &LogIdentity) -> Option<(u64, Vec<String>)> {
    store
        .ids()
        .into_iter()
        .find_map(|id| {
            let meta = store.meta(id).ok()?;
            match check_compatible(ours, &meta.identity, &[]) {
                Ok(()) => Some(None),
                Err(Incompatible::Settings { differences }) => Some(Some((id, differences))),
                // Another log's checkpoint says nothing about this log's settings.
                Err(_) => None,
            }
        })
        .flatten()
}

async fn initial_checkpoint(
    spec: &LogSpec,
    opts: &NodeOptions,
    identity: &LogIdentity,
    store: Option<&CheckpointStore>,
    progress: &StartupProgress,
) -> Result<(Option<Loaded>, StateSource), NodeError> {
    if let Some(store) = store {
        progress.enter(Phase::LoadingCheckpoint);
        if let Some((id, differences)) = settings_changed(store, identity) {
            if opts.settings_change == SettingsChange::Refuse {
                return Err(NodeError::SettingsChanged { checkpoint: id, differences });
            }
            tracing::warn!(
                checkpoint = id,
                ?differences,
                "state settings changed: replaying the log (--replay-on-settings-change)"
            );
        }
        let (loaded, skipped) = newest_usable(store, identity, spec.owned());
        for why in &skipped {
            tracing::warn!("{why}");
        }
        if let Some(l) = loaded {
            let id = l.meta.id;
            progress.checkpoint(format!("checkpoint {id}"), l.meta.holder_blocks());
            tracing::info!(
                checkpoint = id,
                holder_blocks = l.meta.holder_blocks(),
                "restoring the newest usable checkpoint"
            );
            return Ok((Some(l), StateSource::LocalCheckpoint(id)));
        }
    }
    let Some(peer) = &opts.bootstrap_from else { return Ok((None, StateSource::LogStart)) };
    let tls = opts.peer_client_tls();
    tracing::info!(%peer, "no usable local checkpoint: bootstrapping from the peer's newest");
    progress.enter(Phase::FetchingCheckpoint);
    progress.checkpoint(format!("from {peer}"), 0);
    let loaded = match store {
        Some(s) => {
            let meta =
                prefixlog_peer::fetch_into_store(peer, tls.as_ref(), identity, spec.owned(), s).await?;
            s.load(meta.id).map_err(prefixlog_snapshot::RestoreError::from)?
        }
        None => prefixlog_peer::fetch_checkpoint(peer, tls.as_ref(), identity, spec.owned()).await?,
    };
    progress.checkpoint(format!("checkpoint {} from {peer}", loaded.meta.id), loaded.meta.holder_blocks());
    let source = StateSource::Peer { peer: peer.clone(), checkpoint: loaded.meta.id };
    Ok((Some(loaded), source))
}

/// Replaces, accepts or refuses every owned partition the log does not continue.
async fn prove_continuity(
    spec: &LogSpec,
    opts: &NodeOptions,
    identity: &LogIdentity,
    probe: &LogProbe,
    applier: &mut Applier,
) -> Result<(), NodeError> {
    let mut problems = not_continued(spec, applier, spec.owned(), probe).await?;
    if problems.is_empty() {
        return Ok(());
    }
    for p in &problems {
        tracing::error!("the log does not continue this replica's state: {p}");
    }
    for peer in opts.checkpoint_sources() {
        let need: Vec<u32> = problems.iter().map(OffsetProblem::partition).collect();
        match crate::recovery::fetch_continued(
            spec,
            &peer,
            opts.peer_client_tls().as_ref(),
            identity,
            &need,
            probe,
        )
        .await
        {
            Ok(replacement) => {
                for &p in &need {
                    applier.replace_partition(p, &replacement);
                }
                tracing::warn!(%peer, partitions = ?need, "partitions replaced from the peer's checkpoint, which the log continues");
                problems = not_continued(spec, applier, spec.owned(), probe).await?;
                break;
            }
            Err(e) => tracing::warn!(%peer, error = %e, "could not take the partitions from this peer"),
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    if opts.gaps == GapChoice::Accept {
        for p in &problems {
            let to = p.resume_at(probe);
            applier.accept_gap(p.partition(), to);
            tracing::error!(
                "--accept-log-gaps: {p}; reading on from offset {to}, the partition's holders marked gapped"
            );
        }
        return Ok(());
    }
    Err(NodeError::LogDoesNotContinue { problems })
}

//! Choosing the state a replica starts from, and proving the log continues it.
//!
//! In order: the newest local checkpoint that can stand for this replica (the one
//! compatibility rule); else, with `bootstrap_from`, a peer's (that peer first, then the
//! others in `peers`, retried a few times while they are busy serving other transfers); else
//! the empty state at offset 0. The store itself never keeps the replica from starting: on a
//! full disk it opens read-only, and a damaged one is moved aside for a fresh one. Then every owned partition's offset is checked against the log's retained range
//! ([`prefixlog_ingest::continuity`]). A partition the log does not continue is replaced from a
//! peer's checkpoint the log does continue (`bootstrap_from`, then `peers`); failing that the
//! replica refuses to start — naming the partitions, the offsets and the remedies — unless the
//! operator opted into starting with those partitions' holders marked gapped.

use crate::error::NodeError;
use crate::options::{GapChoice, NodeOptions, SettingsChange};
use crate::progress::{Phase, StartupProgress};
use crate::recovery::not_continued;
use prefixlog_ingest::continuity::OffsetProblem;
use prefixlog_ingest::{cleanup_policy, probe_log, CleanupPolicy, LogSpec};
use prefixlog_peer::{FetchError, PeerClient};
use prefixlog_snapshot::{newest_usable, restore_for, CheckpointStore, Loaded, Opened};
use prefixlog_state::LogProbe;
use prefixlog_state::{check_compatible, Applier, Incompatible, LogIdentity};
use std::sync::Arc;
use std::time::Duration;

/// Bootstrap: rounds over the checkpoint sources while some of them are busy (serving their
/// limit of transfers), and the wait between two rounds.
const BOOTSTRAP_ROUNDS: u32 = 6;
const BUSY_RETRY: Duration = Duration::from_secs(5);

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
    /// How the checkpoint store was opened (None: no data dir).
    pub opened: Option<Opened>,
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
        tokio::task::spawn_blocking(move || probe_log(&spec)).await??
    };
    check_cleanup_policy(spec).await?;
    let identity = LogIdentity {
        cluster_id: probe.cluster_id.clone(),
        topic: spec.topic.clone(),
        partitions: spec.partitions,
        owned: spec.owned().to_vec(),
        settings: spec.settings,
    };
    let (store, opened) = match open_store(opts)? {
        Some((s, o)) => (Some(s), Some(o)),
        None => (None, None),
    };
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
    progress.enter(Phase::ProvingContinuity);
    prove_continuity(spec, opts, &identity, &probe, &mut applier).await?;
    if opts.query_copy {
        // Before anything else holds the engine: keyspaces handed out earlier keep one copy.
        applier.engine().keep_query_copies();
        tracing::info!("query copy on: two copies of every keyspace, queries never wait on a write");
    }
    Ok(Prepared { applier, identity, probe, store, source, covered, opened })
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

/// Opens the checkpoint store so that its disk never keeps the replica from starting: see
/// `prefixlog_snapshot::handle` (read-only on a full disk; a damaged directory moved aside).
fn open_store(opts: &NodeOptions) -> Result<Option<(Arc<CheckpointStore>, Opened)>, NodeError> {
    let Some(dir) = &opts.data_dir else { return Ok(None) };
    std::fs::create_dir_all(dir).map_err(|e| NodeError::DataDir { dir: dir.clone(), source: e })?;
    let path = dir.join("checkpoints");
    let (store, opened) = CheckpointStore::open_for_replica(&path)
        .map_err(|e| NodeError::Store { dir: dir.clone(), source: e })?;
    match &opened {
        Opened::Normally => {}
        Opened::ReadOnly { why } => tracing::error!(
            path = %path.display(), error = %why,
            "the data disk is full: the checkpoint store is open read-only (its checkpoints restore); \
             checkpoints resume once space is freed"
        ),
        Opened::Unavailable { why } => tracing::error!(
            path = %path.display(), error = %why,
            "the checkpoint store cannot be opened (disk full): starting from a peer or the log; \
             checkpoints resume once space is freed"
        ),
        Opened::Quarantined { moved_to, why } => tracing::error!(
            path = %path.display(), moved_to = %moved_to.display(), error = %why,
            "the checkpoint store is damaged: moved aside (kept for forensics: inspect, then delete it) \
             and a fresh store created; starting from a peer or the log"
        ),
    }
    Ok(Some((Arc::new(store), opened)))
}

/// A peer's newest checkpoint for a replica without a usable one: `bootstrap_from` first, then
/// the other peers, so one unreachable or busy peer does not keep it from starting; rounds
/// repeat (a few, [`BUSY_RETRY`] apart) while some peer was busy serving other transfers.
async fn bootstrap(
    opts: &NodeOptions,
    identity: &LogIdentity,
    need: &[u32],
    store: Option<&CheckpointStore>,
) -> Result<(Loaded, String), NodeError> {
    let client = opts.peer_client();
    let mut last = None;
    for _ in 0..BOOTSTRAP_ROUNDS {
        let mut busy = false;
        for peer in opts.checkpoint_sources() {
            tracing::info!(%peer, "no usable local checkpoint: bootstrapping from the peer's newest");
            match fetch_one(&client, &peer, identity, need, store).await {
                Ok(l) => return Ok((l, peer)),
                Err(e) => {
                    busy |= e.is_busy();
                    tracing::warn!(%peer, error = %e, "bootstrap: this peer cannot provide a checkpoint now");
                    last = Some(e);
                }
            }
        }
        if !busy {
            break;
        }
        tokio::time::sleep(BUSY_RETRY).await;
    }
    Err(last.map_or_else(|| NodeError::NoBootstrapPeer, NodeError::from))
}

async fn fetch_one(
    client: &PeerClient,
    peer: &str,
    identity: &LogIdentity,
    need: &[u32],
    store: Option<&CheckpointStore>,
) -> Result<Loaded, FetchError> {
    let Some(s) = store.filter(|s| s.health().writable) else {
        return client.fetch_checkpoint(peer, identity, need).await;
    };
    let meta = client.fetch_into_store(peer, identity, need, s).await?;
    s.load(meta.id).map_err(|source| FetchError::Store { peer: peer.into(), source })
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
    if opts.bootstrap_from.is_none() {
        return Ok((None, StateSource::LogStart));
    }
    progress.enter(Phase::FetchingCheckpoint);
    let (loaded, peer) = bootstrap(opts, identity, spec.owned(), store).await?;
    progress.checkpoint(format!("checkpoint {} from {peer}", loaded.meta.id), loaded.meta.holder_blocks());
    let source = StateSource::Peer { peer, checkpoint: loaded.meta.id };
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
    let client = opts.peer_client();
    for peer in opts.checkpoint_sources() {
        let need: Vec<u32> = problems.iter().map(OffsetProblem::partition).collect();
        match crate::recovery::fetch_continued(spec, &peer, &client, identity, &need, probe).await {
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

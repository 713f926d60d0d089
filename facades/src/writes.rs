//! What the facades that write to the log share: before a facade continues a worker's feed it
//! must see everything already on the log for that worker (its partition applied up to the
//! high watermark), and the worker's recorded name must be the one asking (two names that hash
//! to one worker id are refused, never merged). And a record the replica would refuse on
//! apply for a shared per-partition limit (`too_many_workers`, `too_many_keyspaces`) is refused
//! to its writer before it is appended ([`check_shared_limits`]), so the writer is told.

use prefixlog_engine::{partition_of, KeyspaceId};
use prefixlog_query::QueryService;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The replica did not apply a worker's partition up to its high watermark in time.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("partition {partition} not applied up to offset {high} within {wait:?}")]
pub struct NotCaughtUp {
    pub partition: u32,
    pub high: i64,
    pub wait: Duration,
}

/// Waits until the replica applied `worker`'s partition up to its high watermark (as last read
/// from the broker), so the state a facade continues includes every record acknowledged
/// before, by this process or an earlier one: a reused sequence number would make the log skip
/// a batch, and a skipped removal would overcount.
pub async fn caught_up(query: &QueryService, worker: u64, wait: Duration) -> Result<(), NotCaughtUp> {
    let view = query.view();
    let partition = partition_of(worker, view.info.partition_count);
    let high = view.status.partitions[partition as usize].high_watermark.load(Ordering::Acquire);
    if view.status.wait_for(&[(partition, high)], wait).await {
        Ok(())
    } else {
        Err(NotCaughtUp { partition, high, wait })
    }
}

/// `worker`'s metadata as the replica recorded it (None: never announced), unless it was
/// announced under a name other than `name` (its `name_key` entry): then that name.
pub fn recorded_metadata(
    query: &QueryService,
    worker: u64,
    name_key: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, String> {
    let view = query.view();
    let Some(applier) = &view.applier else { return Ok(None) };
    let metadata = applier
        .lock()
        .partition(partition_of(worker, view.info.partition_count))
        .workers
        .get(&worker)
        .cloned();
    match metadata.as_ref().map(|m| m.get(name_key).map_or("a worker of another publisher", String::as_str)) {
        Some(other) if other != name => Err(other.to_string()),
        _ => Ok(metadata),
    }
}

/// A shared per-partition limit a record would pass (the replica would refuse it on apply).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SharedLimit {
    #[error(
        "partition {partition} already has {max} workers (--max-workers-per-partition): a new one \
         would be refused on apply (too_many_workers)"
    )]
    Workers { partition: u32, max: u32 },
    #[error(
        "partition {partition} already uses {max} keyspaces (--max-keyspaces-per-partition): a new \
         one would be refused on apply (too_many_keyspaces)"
    )]
    Keyspaces { partition: u32, max: u32 },
}

impl SharedLimit {
    /// The apply refusal's reason, also the label it is counted under here.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Workers { .. } => "too_many_workers",
            Self::Keyspaces { .. } => "too_many_keyspaces",
        }
    }
}

/// Whether `worker`'s next records (a `WorkerAdded` if `announces`, records in `keyspace`)
/// pass its partition's shared limits as this replica applied the partition, with the
/// replica's own settings. Records by other writers may land in between: the check catches the
/// full partition, not the race for its last place (that record is still refused on apply and
/// counted there only).
pub fn check_shared_limits(
    query: &QueryService,
    worker: u64,
    announces: bool,
    keyspace: Option<&KeyspaceId>,
) -> Result<(), SharedLimit> {
    let view = query.view();
    let Some(applier) = &view.applier else { return Ok(()) };
    let partition = partition_of(worker, view.info.partition_count);
    let a = applier.lock();
    let s = a.settings();
    let part = a.partition(partition);
    if announces
        && !part.workers.contains_key(&worker)
        && part.workers.len() >= s.max_workers_per_partition as usize
    {
        return Err(SharedLimit::Workers { partition, max: s.max_workers_per_partition });
    }
    let usage = a.usage(partition);
    if let Some(ks) = keyspace {
        if !usage.uses(ks) && usage.keyspaces().count() >= s.max_keyspaces_per_partition as usize {
            return Err(SharedLimit::Keyspaces { partition, max: s.max_keyspaces_per_partition });
        }
    }
    Ok(())
}

/// The metadata keys under which the write facades record a holder's / worker's name (SMG's
/// `smg.holder`, SGLang's `sgl.worker_id`).
pub const NAME_KEYS: [&str; 2] = ["smg.holder", "sgl.worker_id"];

/// Every named worker this replica applied (in the partitions it owns): its id, its name (under
/// one of [`NAME_KEYS`]) and the keyspaces it feeds or holds blocks in.
pub fn recorded_writers(query: &QueryService) -> Vec<(u64, String, Vec<KeyspaceId>)> {
    let view = query.view();
    let Some(applier) = &view.applier else { return Vec::new() };
    let a = applier.lock();
    let mut named: std::collections::HashMap<u64, (String, std::collections::BTreeSet<KeyspaceId>)> =
        std::collections::HashMap::new();
    for &p in &view.info.owned {
        let part = a.partition(p);
        for (&worker, meta) in &part.workers {
            if let Some(name) = NAME_KEYS.iter().find_map(|k| meta.get(*k)) {
                named.insert(worker, (name.clone(), Default::default()));
            }
        }
        for key in part.feeds.keys() {
            if let Some((_, ks)) = named.get_mut(&key.worker) {
                ks.insert(key.keyspace.clone());
            }
        }
    }
    for ks in a.engine().keyspaces() {
        let k = ks.read();
        for h in k.holder_summaries() {
            if let Some((_, set)) = named.get_mut(&h.key.worker) {
                set.insert(k.id().clone());
            }
        }
    }
    named.into_iter().map(|(w, (name, ks))| (w, name, ks.into_iter().collect())).collect()
}

/// Seeds `policy`'s per-writer quota use from the replica's state once the replica is ready
/// (caught up with the log), the first time a write asks: quotas survive a facade restart.
pub fn seed_quotas(policy: &crate::writers::WriterPolicy, query: &QueryService) {
    if policy.needs_seed() && query.view().readiness.is_ready() {
        policy.seed(&recorded_writers(query));
    }
}

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

//! What the facades that write to the log share: before a facade continues a worker's feed it
//! must see everything already on the log for that worker (its partition applied up to the
//! high watermark), and the worker's recorded name must be the one asking (two names that hash
//! to one worker id are refused, never merged).

use prefixlog_engine::partition_of;
use prefixlog_query::QueryService;
use prefixlog_state::NextOffset;
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
    if view.status.wait_for(&[NextOffset::new(partition, high)], wait).await {
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

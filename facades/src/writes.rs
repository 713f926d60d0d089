//! What the facades that write to the log share: before a facade continues a worker's feed it
//! must see everything already on the log for that worker (its partition applied up to the
//! high watermark), and the worker's recorded name must be the one asking (two names that hash
//! to one worker id are refused, never merged). [`WriteRefused`] is why a write of the SGLang
//! or SMG facade was refused for a reason both share (each facade's `WriteError` wraps it), with
//! its status and metrics reason; [`check_metadata_size`] the metadata bound both apply. And a
//! record the replica would refuse on apply for a shared per-partition limit
//! (`too_many_workers`, `too_many_keyspaces`) is refused to its writer before it is appended
//! ([`check_shared_limits`]), so the writer is told.

use prefixlog_engine::{partition_of, KeyspaceId};
use prefixlog_query::QueryService;
use prefixlog_state::settings::{StateSettings, METADATA_ENTRY_BYTES};
use prefixlog_state::{LogError, NextOffset};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tonic::Status;

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

/// What a writing facade writes for: a SGLang worker or an SMG holder. It names the subject in
/// the messages of [`WriteRefused`] and in its metrics reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    /// A SGLang worker (`worker_id`).
    Worker,
    /// An SMG holder.
    Holder,
}

impl Subject {
    /// The field that names one.
    fn name_field(self) -> &'static str {
        match self {
            Self::Worker => "worker_id",
            Self::Holder => "holder",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Self::Worker => "workers",
            Self::Holder => "holders",
        }
    }

    /// The state a facade continues for one.
    fn state(self) -> &'static str {
        match self {
            Self::Worker => "feed state",
            Self::Holder => "holder state",
        }
    }

    /// That state, not known yet.
    fn state_of_one(self) -> &'static str {
        match self {
            Self::Worker => "the worker's feed state",
            Self::Holder => "the holder's state",
        }
    }

    /// What its metadata record holds.
    fn metadata(self) -> &'static str {
        match self {
            Self::Worker => "worker metadata (worker_id, address, cache spec, worker_epoch)",
            Self::Holder => "holder metadata (name, Added.metadata as hex, capacity)",
        }
    }
}

/// Why a write was refused, for a reason every writing facade shares.
#[derive(Debug, thiserror::Error)]
pub enum WriteRefused {
    #[error("{} {name:?} maps to worker {worker:016x}, which is recorded for {other:?}: refused (two {} are never merged)", subject.name_field(), subject.plural())]
    Collision { subject: Subject, name: String, worker: u64, other: String },
    #[error("this replica is not ready (it cannot vouch for the {} it would continue); try another", .0.state())]
    NotReady(Subject),
    #[error("this replica has not applied partition {partition} up to its high watermark {high} within {wait:?}: {} is not known yet", subject.state_of_one())]
    NotCaughtUp { subject: Subject, partition: u32, high: i64, wait: Duration },
    #[error("appending to the log: {0}")]
    Publish(#[from] LogError),
    #[error("{} would be {bytes} bytes; the log takes at most {max}", subject.metadata())]
    MetadataTooLarge { subject: Subject, bytes: u64, max: u64 },
}

impl WriteRefused {
    /// The refusal on the wire.
    pub fn status(&self) -> Status {
        match self {
            Self::MetadataTooLarge { .. } => Status::invalid_argument(self.to_string()),
            Self::Collision { .. } => Status::failed_precondition(self.to_string()),
            Self::NotReady(_) | Self::NotCaughtUp { .. } | Self::Publish(_) => {
                Status::unavailable(self.to_string())
            }
        }
    }

    /// The metrics reason of a refusal that is counted (a name collision).
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Self::Collision { subject: Subject::Worker, .. } => Some("worker_id_collision"),
            Self::Collision { subject: Subject::Holder, .. } => Some("holder_collision"),
            _ => None,
        }
    }

    /// [`NotCaughtUp`] for `subject`.
    pub fn not_caught_up(subject: Subject, e: NotCaughtUp) -> Self {
        Self::NotCaughtUp { subject, partition: e.partition, high: e.high, wait: e.wait }
    }
}

/// [`caught_up`] for a writing facade's `subject`.
pub async fn caught_up_for(
    subject: Subject,
    query: &QueryService,
    worker: u64,
    wait: Duration,
) -> Result<(), WriteRefused> {
    caught_up(query, worker, wait).await.map_err(|e| WriteRefused::not_caught_up(subject, e))
}

/// [`recorded_metadata`] for a writing facade's `subject`, a name collision refused.
pub fn recorded_metadata_for(
    subject: Subject,
    query: &QueryService,
    worker: u64,
    name_key: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, WriteRefused> {
    recorded_metadata(query, worker, name_key, name).map_err(|other| WriteRefused::Collision {
        subject,
        name: name.into(),
        worker,
        other,
    })
}

/// Refuses metadata the replica would refuse on apply (`metadata_too_large` at its default
/// `--max-worker-metadata-bytes`), measured as it measures it: every key and value plus
/// `METADATA_ENTRY_BYTES` per entry. Publishing it would answer OK while the worker stays
/// nameless (no address: never routed to).
pub fn check_metadata_size(
    subject: Subject,
    metadata: &BTreeMap<String, String>,
) -> Result<(), WriteRefused> {
    let max = u64::from(StateSettings::default().max_worker_metadata_bytes);
    let bytes: u64 =
        metadata.iter().map(|(k, v)| (k.len() + v.len()) as u64 + u64::from(METADATA_ENTRY_BYTES)).sum();
    if bytes > max {
        return Err(WriteRefused::MetadataTooLarge { subject, bytes, max });
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared refusals keep each facade's own words and codes.
    #[test]
    fn refusals_name_their_subject_with_unchanged_codes() {
        let c = |subject| WriteRefused::Collision { subject, name: "a".into(), worker: 1, other: "b".into() };
        assert_eq!(
            c(Subject::Worker).to_string(),
            "worker_id \"a\" maps to worker 0000000000000001, which is recorded for \"b\": refused (two workers are never merged)"
        );
        assert_eq!(
            c(Subject::Holder).to_string(),
            "holder \"a\" maps to worker 0000000000000001, which is recorded for \"b\": refused (two holders are never merged)"
        );
        assert_eq!(c(Subject::Worker).status().code(), tonic::Code::FailedPrecondition);
        assert_eq!(c(Subject::Holder).reason(), Some("holder_collision"));
        assert_eq!(
            WriteRefused::NotReady(Subject::Holder).to_string(),
            "this replica is not ready (it cannot vouch for the holder state it would continue); try another"
        );
        assert_eq!(WriteRefused::NotReady(Subject::Worker).status().code(), tonic::Code::Unavailable);
        let late = WriteRefused::NotCaughtUp {
            subject: Subject::Worker,
            partition: 2,
            high: 7,
            wait: Duration::from_secs(1),
        };
        assert_eq!(
            late.to_string(),
            "this replica has not applied partition 2 up to its high watermark 7 within 1s: the worker's feed state is not known yet"
        );
        assert_eq!(late.status().code(), tonic::Code::Unavailable);
        assert_eq!(late.reason(), None);
    }

    #[test]
    fn metadata_over_the_replicas_limit_is_refused() {
        let max = u64::from(StateSettings::default().max_worker_metadata_bytes);
        let value = |n: u64| BTreeMap::from([("k".to_string(), "v".repeat(n as usize))]);
        let fixed = 1 + u64::from(METADATA_ENTRY_BYTES);
        assert!(check_metadata_size(Subject::Holder, &value(max - fixed)).is_ok());
        let err = check_metadata_size(Subject::Holder, &value(max - fixed + 1)).unwrap_err();
        assert!(matches!(err, WriteRefused::MetadataTooLarge { bytes, .. } if bytes == max + 1));
        assert_eq!(err.status().code(), tonic::Code::InvalidArgument);
        assert!(err
            .to_string()
            .starts_with("holder metadata (name, Added.metadata as hex, capacity) would be"));
    }
}

//! The engine subscriptions a replica runs for the registrations it accepted: one feed (run by
//! the replica's [`EngineFeeds`], the bridge's engine stream in `prefixlog serve`) per registered
//! (instance, dp rank) whose registrar is this replica, publishing the engine's KV events to the
//! log under Dynamo's hash scheme.
//!
//! One writer per feed: a registration names its registrar (its replica id) in the log, and
//! only that replica subscribes; every replica applies the same records, so they agree on who
//! it is. What runs follows what the log says ([`Listeners::reconcile`]): after this replica
//! restarts (with the same `--replica-id`) it subscribes again, and a worker removed from the
//! log by anyone loses its subscription. A subscription starts a new epoch above every epoch
//! its feed has seen (the applied state's, and any this replica used), so whatever an earlier
//! subscription left is cleared by the first batch of the new one, never mixed with it.
//!
//! A subscription whose feed shows a newer epoch than its own is restarted above it (another
//! writer's: a registration accepted at the same moment by another replica and replaced since).
//!
//! A subscription's `status` is upstream's listener status: `active` while it runs, `failed`
//! (with `last_error`) if it stopped on an error.

use super::feeds::{EngineFeeds, FeedStart};
use super::registration::{Rank, Registration};
use parking_lot::Mutex;
use prefixlog_engine::{partition_of, KeyspaceId};
use prefixlog_query::QueryService;
use prefixlog_state::partition_state::FeedKey;
use prefixlog_state::LogAppend;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a stopping subscription may take to flush its records before it is aborted (well
/// within the 10 s a request may take: `/unregister` stops subscriptions before it writes).
const STOP_WAIT: Duration = Duration::from_secs(3);

/// A subscription's state, as `/workers` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    pub status: &'static str,
    pub last_error: Option<String>,
}

/// What a subscription was started from: it is restarted when this changes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Wanted {
    keyspace: KeyspaceId,
    rank: Rank,
}

struct Task {
    wanted: Wanted,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
    live: Arc<Mutex<Live>>,
    /// The epoch it started with; its session moves one epoch up per engine restart, which
    /// `epochs_moved` counts.
    epoch: u64,
    epochs_moved: Arc<dyn Fn() -> u64 + Send + Sync>,
}

impl Task {
    /// The epoch its records carry now.
    fn epoch_now(&self) -> u64 {
        self.epoch + (self.epochs_moved)()
    }
}

/// The subscriptions of one replica.
pub struct Listeners {
    replica: String,
    query: QueryService,
    feeds: Arc<dyn EngineFeeds>,
    log: Arc<dyn LogAppend>,
    tasks: Mutex<BTreeMap<(u64, u32), Task>>,
    /// The last epoch this replica used per feed.
    epochs: Mutex<BTreeMap<FeedKey, u64>>,
}

impl Listeners {
    pub fn new(query: QueryService, feeds: Arc<dyn EngineFeeds>) -> Self {
        let replica = query.view().info.replica_id.clone();
        let log = feeds.log();
        Self { replica, query, feeds, log, tasks: Mutex::default(), epochs: Mutex::default() }
    }

    /// This replica's id: the registrar of the registrations it accepts.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Where registrations are written.
    pub fn log(&self) -> &dyn LogAppend {
        &*self.log
    }

    /// The state of the subscription to `(worker, dp)`, if this replica runs one.
    pub fn live(&self, worker: u64, dp: u32) -> Option<Live> {
        self.tasks.lock().get(&(worker, dp)).map(|t| t.live.lock().clone())
    }

    /// An epoch for `feed` above the applied state's and any this replica used (and at least
    /// the time in ms, as `prefixlog bridge` starts its epochs, so both order the same way).
    pub fn next_epoch(&self, feed: &FeedKey) -> u64 {
        let applied = self.applied_epoch(feed);
        let mut epochs = self.epochs.lock();
        let used = epochs.get(feed).copied();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let next = [applied.map(|e| e + 1), used.map(|e| e + 1), Some(now)].into_iter().flatten().max();
        let next = next.unwrap_or(now);
        // Bounded: an epoch the applied state has reached is remembered there.
        epochs.retain(|f, e| self.applied_epoch(f) < Some(*e));
        epochs.insert(feed.clone(), next);
        next
    }

    /// The epoch of `feed` in the applied state, if it has one.
    fn applied_epoch(&self, feed: &FeedKey) -> Option<u64> {
        let view = self.query.view();
        let p = partition_of(feed.worker, view.info.partition_count);
        view.applier.as_ref().and_then(|a| a.lock().partition(p).feeds.get(feed).map(|f| f.epoch))
    }

    /// Makes what runs what the log says: a subscription for every rank of every registration
    /// whose registrar is this replica, none other. Call with the registrar's lock held (a
    /// registration being written must not be started or stopped halfway).
    ///
    /// A subscription whose feed carries a newer epoch than its own (another writer's: a
    /// registration of this instance accepted at the same moment by another replica, replaced
    /// since, whose clock was ahead) is restarted above it: its records would otherwise be
    /// skipped as stale, and the feed stay gapped.
    pub async fn reconcile(&self) {
        let wanted = self.wanted();
        // Copied out first: the applier's lock is never taken under the tasks' (`/workers`
        // takes them the other way round).
        let running: Vec<((u64, u32), Wanted, u64)> =
            self.tasks.lock().iter().map(|(k, t)| (*k, t.wanted.clone(), t.epoch_now())).collect();
        let stale: Vec<(u64, u32)> = running
            .into_iter()
            .filter(|((w, dp), want, epoch)| {
                let feed = FeedKey { keyspace: want.keyspace.clone(), worker: *w, dp_rank: *dp };
                wanted.get(&(*w, *dp)) != Some(want) || self.applied_epoch(&feed) > Some(*epoch)
            })
            .map(|(k, _, _)| k)
            .collect();
        for (w, dp) in stale {
            self.stop(w, dp).await;
        }
        for ((w, dp), want) in wanted {
            if !self.tasks.lock().contains_key(&(w, dp)) {
                self.start(w, dp, want);
            }
        }
    }

    /// Registrations of this replica in the applied state, per (worker, dp rank).
    fn wanted(&self) -> BTreeMap<(u64, u32), Wanted> {
        let view = self.query.view();
        let mut out = BTreeMap::new();
        let Some(applier) = &view.applier else { return out };
        let a = applier.lock();
        for &p in &view.info.owned {
            for (&w, meta) in &a.partition(p).workers {
                let Some(reg) = Registration::from_meta(meta).filter(|r| r.registrar == self.replica) else {
                    continue;
                };
                for (&dp, rank) in &reg.ranks {
                    out.insert((w, dp), Wanted { keyspace: reg.keyspace(), rank: rank.clone() });
                }
            }
        }
        out
    }

    fn start(&self, worker: u64, dp: u32, wanted: Wanted) {
        let feed = FeedKey { keyspace: wanted.keyspace.clone(), worker, dp_rank: dp };
        let epoch = self.next_epoch(&feed);
        let start = FeedStart {
            keyspace: wanted.keyspace.clone(),
            worker,
            dp_rank: dp,
            endpoint: wanted.rank.endpoint.clone(),
            replay_endpoint: wanted.rank.replay.clone(),
            start_epoch: epoch,
        };
        let (stop, stopped) = watch::channel(false);
        let started = self.feeds.start(start, stopped);
        let live = Arc::new(Mutex::new(Live { status: "active", last_error: None }));
        let state = live.clone();
        let run = started.run;
        let handle = tokio::spawn(async move {
            if let Err(e) = run.await {
                tracing::error!(worker, dp_rank = dp, error = %e, "dynamo /register subscription failed");
                *state.lock() = Live { status: "failed", last_error: Some(e) };
            }
        });
        tracing::info!(worker, dp_rank = dp, endpoint = %wanted.rank.endpoint, "dynamo /register: subscribed");
        let task = Task { wanted, stop, handle, live, epoch, epochs_moved: started.epochs_moved };
        self.tasks.lock().insert((worker, dp), task);
    }

    /// Stops the subscription to `(worker, dp)` (if any) and waits until its records are
    /// acknowledged (bounded: then it is aborted).
    pub async fn stop(&self, worker: u64, dp: u32) {
        let Some(task) = self.tasks.lock().remove(&(worker, dp)) else { return };
        let _ = task.stop.send(true);
        let abort = task.handle.abort_handle();
        if tokio::time::timeout(STOP_WAIT, task.handle).await.is_err() {
            abort.abort();
            tracing::warn!(
                worker,
                dp_rank = dp,
                "dynamo /register: subscription aborted after {STOP_WAIT:?}"
            );
        }
        self.feeds.ended(worker, &task.wanted.rank.endpoint);
        tracing::info!(worker, dp_rank = dp, "dynamo /register: unsubscribed");
    }

    /// Stops every subscription of `worker`.
    pub async fn stop_worker(&self, worker: u64) {
        let ranks: Vec<u32> = self.tasks.lock().keys().filter(|k| k.0 == worker).map(|k| k.1).collect();
        for dp in ranks {
            self.stop(worker, dp).await;
        }
    }

    /// Aborts every subscription at once (the replica is stopping).
    pub fn abort_all(&self) {
        for (_, t) in std::mem::take(&mut *self.tasks.lock()) {
            t.handle.abort();
        }
    }
}

//! `POST /register` and `POST /unregister` of the Dynamo dialect: a registration is written to
//! the log (its worker's `WorkerAdded` metadata, [`super::registration`]) and fed by the
//! replica that accepted it ([`super::listeners`]), with upstream's checks, in upstream's
//! order and words: a bad endpoint is 400; an instance registered for another model or routing
//! group, a rank registered twice, or a block size other than the routing group's is 409; an
//! unknown instance or rank on `/unregister` is 404.
//!
//! One writer per feed, across replicas and restarts: the registration names this replica as
//! its registrar, and only the registrar subscribes. Registrations are written under one lock
//! per replica, after catching up with the worker's partition, and checked once applied: a
//! registration that another replica's record replaced in between is refused (409), never
//! reported as accepted. What only prefixlog can meet is refused with its own words: an
//! instance announced on the log by another publisher (`prefixlog bridge`, a facade), or
//! registered through another replica (its other ranks are registered, and it is unregistered,
//! through that one), or metadata over the log's per-worker limit.

use super::listeners::Listeners;
use super::registration::{validate_endpoints, Rank, Registration};
use super::wire::{RegisterRequest, UnregisterRequest};
use super::{DEFAULT_ROUTING_GROUP, META_ROUTING_GROUP};
use super::{META_BLOCK_SIZE, META_MODEL};
use crate::writes::caught_up;
use axum::http::StatusCode;
use prefixlog_engine::partition_of;
use prefixlog_query::QueryService;
use prefixlog_state::partition_state::FeedKey;
use prefixlog_state::record::{encode_lifecycle, KvBatch, KvOp, Lifecycle};
use prefixlog_state::settings::METADATA_ENTRY_BYTES;
use prefixlog_state::{token_of, Landed};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a registration waits for the replica to catch up and to apply what it wrote.
const WAIT: Duration = Duration::from_secs(5);

/// Why a registration change was not made; each carries its HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// Upstream's 400 (`validate_listener_endpoints`).
    #[error("{0}")]
    Endpoint(String),
    /// Upstream's 409 on `/register`, with its words.
    #[error("{0}")]
    Conflict(String),
    /// Upstream's 404 on `/unregister`, with its words.
    #[error("{0}")]
    NotFound(String),
    #[error("instance {0} is announced on the log by another publisher (prefixlog bridge or a facade), not registered through this API")]
    OtherPublisher(u64),
    #[error("instance {worker} is registered through replica {registrar}; register its other ranks and unregister it there")]
    OtherReplica { worker: u64, registrar: String },
    #[error("instance {0}'s registration was replaced on the log by a concurrent one; retry")]
    Overtaken(u64),
    #[error("instance {worker}'s registration ({bytes} bytes of metadata) is over the log's limit of {limit} bytes per worker")]
    TooLarge { worker: u64, bytes: usize, limit: u32 },
    #[error("this replica is not ready (catching up with the log); ask another")]
    NotReady,
    #[error("{0}")]
    Unavailable(String),
}

impl RegisterError {
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::Endpoint(_) | Self::TooLarge { .. } => StatusCode::BAD_REQUEST,
            Self::Conflict(_) | Self::OtherPublisher(_) | Self::OtherReplica { .. } | Self::Overtaken(_) => {
                StatusCode::CONFLICT
            }
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::NotReady | Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The gRPC code the facade metrics count it under.
    pub fn code(&self) -> tonic::Code {
        match self {
            Self::Endpoint(_) | Self::TooLarge { .. } => tonic::Code::InvalidArgument,
            Self::Conflict(_) | Self::OtherPublisher(_) | Self::OtherReplica { .. } => {
                tonic::Code::AlreadyExists
            }
            Self::Overtaken(_) => tonic::Code::Aborted,
            Self::NotFound(_) => tonic::Code::NotFound,
            Self::NotReady | Self::Unavailable(_) => tonic::Code::Unavailable,
        }
    }
}

/// The registrations of one replica's facade.
pub struct Registrar {
    query: QueryService,
    listeners: Arc<Listeners>,
    /// Held while a registration is checked, written and applied, and while subscriptions are
    /// reconciled: this replica's changes to one worker never interleave.
    lock: tokio::sync::Mutex<()>,
}

impl Registrar {
    pub fn new(query: QueryService, listeners: Arc<Listeners>) -> Self {
        Self { query, listeners, lock: tokio::sync::Mutex::new(()) }
    }

    pub fn listeners(&self) -> &Listeners {
        &self.listeners
    }

    /// Subscribes to what the log says this replica registered (after a restart, say).
    pub async fn reconcile(&self) {
        if self.query.view().readiness.is_ready() {
            let _held = self.lock.lock().await;
            self.listeners.reconcile().await;
        }
    }

    pub async fn register(&self, req: RegisterRequest) -> Result<(), RegisterError> {
        validate_endpoints(&req.endpoint, req.replay_endpoint.as_deref()).map_err(RegisterError::Endpoint)?;
        let worker = req.instance_id;
        let dp = req.dp_rank.unwrap_or(0);
        let _held = self.current(worker).await?;
        let (model, group) = (req.model_name.as_str(), req.routing_group.as_str());
        let mut reg = match self.metadata(worker) {
            None => Registration::new(model, group, req.block_size, self.listeners.replica()),
            Some(m) => Registration::from_meta(&m).ok_or(RegisterError::OtherPublisher(worker))?,
        };
        if (reg.model.as_str(), reg.group.as_str()) != (model, group) {
            return Err(RegisterError::Conflict(format!(
                "instance {worker} is already registered for model={} routing_group={}",
                reg.model, reg.group
            )));
        }
        if reg.ranks.contains_key(&dp) {
            return Err(RegisterError::Conflict(format!(
                "instance {worker} dp_rank {dp} already registered"
            )));
        }
        self.mine(worker, &reg)?;
        if let Some(existing) = self.group_block_size(model, group).filter(|&b| b != req.block_size) {
            return Err(RegisterError::Conflict(format!(
                "block_size mismatch for model={model} routing_group={group}: existing={existing}, requested={}",
                req.block_size
            )));
        }
        reg.ranks.insert(dp, Rank { endpoint: req.endpoint, replay: req.replay_endpoint });
        let meta = reg.to_meta();
        self.fits(worker, &meta)?;
        let landed = self.publish(worker, &Lifecycle::Added { metadata: meta.clone() }).await?;
        self.applied(&[landed]).await?;
        if self.metadata(worker).as_ref() != Some(&meta) {
            return Err(RegisterError::Overtaken(worker));
        }
        self.listeners.reconcile().await;
        Ok(())
    }

    pub async fn unregister(&self, req: UnregisterRequest) -> Result<(), RegisterError> {
        let worker = req.instance_id;
        let _held = self.current(worker).await?;
        let not_found = || RegisterError::NotFound(format!("instance {worker} not found"));
        let meta = self.metadata(worker).ok_or_else(not_found)?;
        let mut reg = Registration::from_meta(&meta).ok_or_else(not_found)?;
        let elsewhere = || {
            RegisterError::NotFound(format!(
                "instance {worker} is registered for model={} routing_group={}",
                reg.model, reg.group
            ))
        };
        if reg.model != req.model_name || req.routing_group.as_ref().is_some_and(|g| *g != reg.group) {
            return Err(elsewhere());
        }
        // Without a routing group upstream removes the whole instance, whatever `dp_rank` says.
        let rank = req.routing_group.and(req.dp_rank);
        if let Some(dp) = rank.filter(|dp| !reg.ranks.contains_key(dp)) {
            return Err(RegisterError::NotFound(format!("instance {worker} dp_rank {dp} not found")));
        }
        self.mine(worker, &reg)?;
        match rank.filter(|_| reg.ranks.len() > 1) {
            None => {
                self.listeners.stop_worker(worker).await;
                let landed = self.publish(worker, &Lifecycle::Removed).await?;
                self.applied(&[landed]).await
            }
            Some(dp) => {
                self.listeners.stop(worker, dp).await;
                reg.ranks.remove(&dp);
                let added = self.publish(worker, &Lifecycle::Added { metadata: reg.to_meta() }).await?;
                let cleared = self.clear_feed(worker, dp, &reg).await?;
                self.applied(&[added, cleared]).await
            }
        }
    }

    /// Takes the lock once the replica is ready and has applied the worker's partition up to
    /// its high watermark (so the worker's registration read next is the latest one).
    async fn current(&self, worker: u64) -> Result<tokio::sync::MutexGuard<'_, ()>, RegisterError> {
        if !self.query.view().readiness.is_ready() {
            return Err(RegisterError::NotReady);
        }
        let held = self.lock.lock().await;
        caught_up(&self.query, worker, WAIT).await.map_err(|e| RegisterError::Unavailable(e.to_string()))?;
        Ok(held)
    }

    /// Refuses a registration another replica feeds.
    fn mine(&self, worker: u64, reg: &Registration) -> Result<(), RegisterError> {
        if reg.registrar == self.listeners.replica() {
            Ok(())
        } else {
            Err(RegisterError::OtherReplica { worker, registrar: reg.registrar.clone() })
        }
    }

    fn metadata(&self, worker: u64) -> Option<BTreeMap<String, String>> {
        let view = self.query.view();
        let a = view.applier.as_ref()?.lock();
        a.partition(partition_of(worker, view.info.partition_count)).workers.get(&worker).cloned()
    }

    /// The block size of the routing group's announced workers (the first by worker id that
    /// records one), upstream's block size of the group's indexer.
    fn group_block_size(&self, model: &str, group: &str) -> Option<u32> {
        let view = self.query.view();
        let a = view.applier.as_ref()?.lock();
        let mut found: Option<(u64, u32)> = None;
        for &p in &view.info.owned {
            for (&w, m) in &a.partition(p).workers {
                let in_group = m.get(META_MODEL).is_some_and(|x| x == model)
                    && m.get(META_ROUTING_GROUP).map_or(DEFAULT_ROUTING_GROUP, String::as_str) == group;
                let bs = m.get(META_BLOCK_SIZE).and_then(|b| b.parse::<u32>().ok());
                if let (true, Some(bs)) = (in_group, bs) {
                    if found.is_none_or(|(fw, _)| w < fw) {
                        found = Some((w, bs));
                    }
                }
            }
        }
        found.map(|(_, bs)| bs)
    }

    /// Refuses metadata the log would skip as too large.
    fn fits(&self, worker: u64, meta: &BTreeMap<String, String>) -> Result<(), RegisterError> {
        let view = self.query.view();
        let Some(limit) = view.applier.as_ref().map(|a| a.lock().settings().max_worker_metadata_bytes) else {
            return Ok(());
        };
        let bytes: usize = meta.iter().map(|(k, v)| k.len() + v.len() + METADATA_ENTRY_BYTES as usize).sum();
        if bytes > limit as usize {
            return Err(RegisterError::TooLarge { worker, bytes, limit });
        }
        Ok(())
    }

    async fn publish(&self, worker: u64, change: &Lifecycle) -> Result<Landed, RegisterError> {
        let record = encode_lifecycle(worker, change);
        self.listeners
            .log()
            .append(worker, record)
            .await
            .map_err(|e| RegisterError::Unavailable(e.to_string()))
    }

    /// A batch of a new epoch for the rank's feed, clearing its lanes (upstream removes an
    /// unregistered rank's blocks).
    async fn clear_feed(&self, worker: u64, dp: u32, reg: &Registration) -> Result<Landed, RegisterError> {
        let keyspace = reg.keyspace();
        let feed = FeedKey { keyspace: keyspace.clone(), worker, dp_rank: dp };
        let epoch = self.listeners.next_epoch(&feed);
        let events = [KvOp::Cleared { lane: 0 }];
        let batch = KvBatch {
            keyspace: &keyspace,
            worker,
            dp_rank: dp,
            epoch,
            seq: 0,
            gap_before: false,
            events: &events,
            lanes: &[],
        };
        let record = batch.encode();
        self.listeners
            .log()
            .append(worker, record)
            .await
            .map_err(|e| RegisterError::Unavailable(e.to_string()))
    }

    async fn applied(&self, landed: &[Landed]) -> Result<(), RegisterError> {
        if self.query.view().status.wait_for(&token_of(landed), WAIT).await {
            Ok(())
        } else {
            Err(RegisterError::Unavailable(format!(
                "the registration was written but not applied within {WAIT:?}"
            )))
        }
    }
}

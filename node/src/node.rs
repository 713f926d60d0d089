//! [`ReplicaNode`]: one running replica, assembled from a [`LogSpec`] and [`NodeOptions`].

use crate::checkpoints::{self, CheckpointMetrics, Checkpointer, LoopContext};
use crate::error::NodeError;
use crate::ingest_thread::{GapPolicy, IngestOptions, IngestThread};
use crate::options::{GapChoice, NodeOptions};
use crate::progress::{Phase, StartupProgress};
use crate::startup::{prepare, Prepared, StateSource};
use parking_lot::Mutex;
use prefixlog_engine::Engine;
use prefixlog_ingest::{LogSpec, Publisher};
use prefixlog_peer::{
    AntiEntropy, AntiEntropyStats, PeerService, RepairContext, RoundReport, ScrubStats, Scrubber, ServeLimits,
};
use prefixlog_query::admin::AdminPort;
use prefixlog_query::ReplicaStatus;
use prefixlog_query::{RunningServer, ServerConfig};
use prefixlog_snapshot::{CheckpointMeta, CheckpointStore, Opened};
use prefixlog_state::{Applier, LogIdentity};
use prometheus::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// Connections the peer port holds: the admin port's defaults (peers are a few replicas).
const PEER_PORT_CONNECTIONS: prefixlog_query::listen::ConnLimits = prefixlog_query::listen::ConnLimits {
    header_timeout: prefixlog_query::listen::DEFAULT_HEADER_TIMEOUT,
    max_connections: prefixlog_query::listen::DEFAULT_MAX_CONNECTIONS,
    max_connections_per_peer: prefixlog_query::listen::DEFAULT_MAX_CONNECTIONS_PER_PEER,
};

/// A running replica: ingest, checkpoints, the peer service, anti-entropy, scrubbing, recovery
/// of cut partitions, ticks, and the query and admin ports.
pub struct ReplicaNode {
    spec: LogSpec,
    opts: NodeOptions,
    identity: LogIdentity,
    source: StateSource,
    replica: Arc<IngestThread>,
    store: Option<Arc<CheckpointStore>>,
    /// How the store was opened (None: no data dir).
    store_opened: Option<Opened>,
    checkpointer: Option<Checkpointer>,
    checkpoint_metrics: Arc<CheckpointMetrics>,
    anti_entropy: Option<Arc<AntiEntropy>>,
    /// The anti-entropy rounds' task (also in `tasks`, aborted with them).
    anti_entropy_task: Option<tokio::task::AbortHandle>,
    scrubber: Option<Arc<Scrubber>>,
    /// What anti-entropy and the scrubber repair with (one repair per partition at a time).
    repair: RepairContext,
    query: RunningServer,
    peer_addr: Option<SocketAddr>,
    peer_stop: Option<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
    registry: Registry,
}

/// What a clean stop did.
#[derive(Debug)]
pub struct Stopped {
    /// The final checkpoint, if one was written (none without a store, or with nothing new).
    pub final_checkpoint: Option<CheckpointMeta>,
    /// Next offsets per partition when ingest stopped.
    pub offsets: Vec<i64>,
}

impl ReplicaNode {
    /// Starts a replica of `spec`'s owned partitions. Refuses to start when it cannot prove
    /// its state (see [`crate::startup`]). The admin port is up from the beginning: while the
    /// state is restored it reports the start-up progress ([`crate::progress`]).
    pub async fn start(spec: LogSpec, opts: NodeOptions) -> Result<Self, NodeError> {
        let registry =
            Registry::new_custom(None, Some([("shard".to_string(), spec.shard.to_string())].into()))?;
        register_process_metrics(&registry);
        prefixlog_query::metrics::register_build_info(&registry)?;
        let progress = StartupProgress::default();
        registry.register(Box::new(progress.clone()))?;
        let admin = match opts.admin_addr {
            None => None,
            Some(addr) => Some(
                AdminPort::bind(addr, registry.clone(), Arc::new(progress.clone()))
                    .await
                    .map_err(|source| NodeError::Bind { what: "the admin port", addr, source })?,
            ),
        };
        let Prepared { applier, identity, store, source, covered, opened, .. } =
            prepare(&spec, &opts, &progress).await?;
        let gap_policy = match opts.gaps {
            GapChoice::Refuse => GapPolicy::Halt,
            GapChoice::Accept => GapPolicy::Accept,
        };
        let ingest = IngestOptions {
            dead_letter_topic: opts.dead_letter_topic.clone(),
            gap_policy,
            cpus: opts.ingest_cpus.clone(),
        };
        let replica = Arc::new(IngestThread::start(&spec, applier, ingest)?);
        let checkpoint_metrics = Arc::new(CheckpointMetrics::new(&registry)?);
        if let Some(s) = &store {
            checkpoint_metrics.store_health(s);
        }
        let checkpointer = store.as_ref().map(|s| {
            if let Some(meta) = s.ids().first().and_then(|&id| s.meta(id).ok()) {
                checkpoint_metrics.seen(&meta);
            }
            let ctx = LoopContext {
                applier: replica.applier().clone(),
                store: s.clone(),
                identity: identity.clone(),
                policy: opts.checkpoints.clone(),
                metrics: checkpoint_metrics.clone(),
            };
            Checkpointer::spawn(ctx, covered)
        });
        let repair = RepairContext::new(Arc::new(spec.clone()), identity.clone(), store.clone());
        let mut node = Self {
            query: start_query(&spec, &opts, &replica, &registry, admin).await?,
            spec,
            opts,
            identity,
            source,
            replica,
            store,
            store_opened: opened,
            checkpointer,
            checkpoint_metrics,
            anti_entropy: None,
            anti_entropy_task: None,
            scrubber: None,
            repair,
            peer_addr: None,
            peer_stop: None,
            tasks: Vec::new(),
            registry,
        };
        node.start_peering().await?;
        node.start_scrubbing()?;
        node.start_ticks()?;
        progress.enter(Phase::Serving);
        tracing::info!(
            topic = %node.spec.topic,
            shard = %node.spec.shard,
            partitions = ?node.spec.owned(),
            source = ?node.source,
            grpc = %node.query.grpc_addr,
            peer = ?node.peer_addr,
            "replica started"
        );
        Ok(node)
    }

    async fn start_peering(&mut self) -> Result<(), NodeError> {
        if let Some(addr) = self.opts.peer_addr {
            let limits = ServeLimits {
                checkpoint_transfers: self.opts.peer_checkpoint_transfers,
                ..ServeLimits::default()
            };
            let svc = PeerService::new(
                self.replica.applier().clone(),
                self.store.clone(),
                self.opts.replica_id.clone(),
                self.identity.clone(),
                limits,
            );
            let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| NodeError::Bind {
                what: "the peer port",
                addr,
                source,
            })?;
            self.peer_addr = Some(listener.local_addr().map_err(|source| NodeError::Bind {
                what: "the peer port",
                addr,
                source,
            })?);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            self.peer_stop = Some(stop);
            use prefixlog_query::server::{
                H2_KEEPALIVE_INTERVAL, H2_KEEPALIVE_TIMEOUT, H2_MAX_CONCURRENT_STREAMS,
            };
            // The query port's HTTP/2 bounds: streams per connection, dead peers found by keepalive.
            let mut builder = tonic::transport::Server::builder()
                .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
                .http2_keepalive_interval(Some(H2_KEEPALIVE_INTERVAL))
                .http2_keepalive_timeout(Some(H2_KEEPALIVE_TIMEOUT));
            if let Some(tls) = &self.opts.peer_tls {
                builder = builder.tls_config(tls.server()).map_err(NodeError::PeerTls)?;
            }
            let refused = prefixlog_query::listen::counted_refusals(&self.registry, "peer");
            self.tasks.push(tokio::spawn(async move {
                let incoming =
                    prefixlog_query::listen::admitted(listener, PEER_PORT_CONNECTIONS, "peer", refused);
                let shutdown = async move {
                    let _ = stopped.await;
                };
                if let Err(e) = builder
                    .add_service(svc.into_server())
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
                {
                    tracing::error!(error = %e, "peer service stopped");
                }
            }));
        }
        let ctx = self.repair.clone();
        if !self.opts.peers.is_empty() {
            let stats = Arc::new(AntiEntropyStats::new());
            stats.init(&self.opts.peers, self.spec.owned());
            stats.register(&self.registry)?;
            let ae = Arc::new(AntiEntropy {
                replica: self.replica.clone(),
                peers: self.opts.peers.clone(),
                ctx,
                stats,
                client: self.opts.peer_client(),
            });
            let (every, weak) = (self.opts.anti_entropy_interval, Arc::downgrade(&ae));
            let rounds = tokio::spawn(async move {
                let mut t = tokio::time::interval(every);
                // A round that outlasts the interval (a repair) delays the next; no burst after.
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                t.tick().await;
                loop {
                    t.tick().await;
                    let Some(ae) = weak.upgrade() else { return };
                    ae.round().await;
                }
            });
            self.anti_entropy_task = Some(rounds.abort_handle());
            self.tasks.push(rounds);
            self.anti_entropy = Some(ae);
        }
        let sources = self.opts.checkpoint_sources();
        if !sources.is_empty() {
            let recoveries = prometheus::IntCounterVec::new(
                prometheus::Opts::new(
                    "prefixlog_partition_recoveries_total",
                    "Recoveries of cut partitions from peers",
                ),
                &["outcome"],
            )?;
            for outcome in ["recovered", "failed"] {
                recoveries.with_label_values(&[outcome]);
            }
            self.registry.register(Box::new(recoveries.clone()))?;
            let sources = crate::recovery::Sources { peers: sources, client: self.opts.peer_client() };
            let task = crate::recovery::run(
                self.spec.clone(),
                self.identity.clone(),
                sources,
                self.replica.clone(),
                recoveries,
            );
            self.tasks.push(tokio::spawn(task));
        }
        Ok(())
    }

    fn start_scrubbing(&mut self) -> Result<(), NodeError> {
        let o = self.opts.scrub;
        if o.interval.is_zero() {
            return Ok(());
        }
        let stats = Arc::new(ScrubStats::new());
        stats.register(&self.registry, self.spec.owned())?;
        let ctx = self.repair.clone();
        let scrubber = Arc::new(Scrubber::new(self.replica.clone(), ctx, stats, o.budget));
        self.tasks.push(tokio::spawn(scrubber.clone().run(o.interval)));
        self.scrubber = Some(scrubber);
        Ok(())
    }

    fn start_ticks(&mut self) -> Result<(), NodeError> {
        if self.opts.tick_interval.is_zero() {
            return Ok(());
        }
        let publisher = Publisher::new(&self.spec)?;
        let (every, owned) = (self.opts.tick_interval, self.spec.owned().to_vec());
        self.tasks.push(tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            loop {
                t.tick().await;
                if let Err(e) = publisher.publish_ticks(&owned, None).await {
                    tracing::warn!(error = %e, "publishing ticks failed; log time may stall on quiet partitions");
                }
            }
        }));
        Ok(())
    }

    pub fn spec(&self) -> &LogSpec {
        &self.spec
    }

    pub fn identity(&self) -> &LogIdentity {
        &self.identity
    }

    /// Where the starting state came from.
    pub fn source(&self) -> &StateSource {
        &self.source
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.query.grpc_addr
    }

    /// `http://` + the gRPC address, as clients take endpoints.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.query.grpc_addr)
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.query.admin_addr
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
    }

    pub fn status(&self) -> &Arc<ReplicaStatus> {
        self.replica.status()
    }

    pub fn applier(&self) -> &Arc<Mutex<Applier>> {
        self.replica.applier()
    }

    pub fn engine(&self) -> Arc<Engine> {
        self.replica.applier().lock().engine().clone()
    }

    pub fn replica(&self) -> &Arc<IngestThread> {
        &self.replica
    }

    pub fn store(&self) -> Option<&Arc<CheckpointStore>> {
        self.store.as_ref()
    }

    /// How the checkpoint store was opened: normally, read-only (full disk), or after moving a
    /// damaged one aside (None: no data dir).
    pub fn store_opened(&self) -> Option<&Opened> {
        self.store_opened.as_ref()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// (ready, reason), as `/readyz` says.
    pub fn ready(&self) -> (bool, String) {
        self.query.readiness.check()
    }

    /// One anti-entropy round now (None without peers).
    pub async fn anti_entropy_round(&self) -> Option<RoundReport> {
        match &self.anti_entropy {
            Some(ae) => Some(ae.round().await),
            None => None,
        }
    }

    pub fn anti_entropy(&self) -> Option<&Arc<AntiEntropy>> {
        self.anti_entropy.as_ref()
    }

    /// Stops the periodic anti-entropy rounds (a round under way is cancelled; explicit
    /// rounds still run). For stopping several replicas of one process together: their peers
    /// going away one by one is then not reported as unreachable.
    pub fn stop_anti_entropy_rounds(&self) {
        if let Some(t) = &self.anti_entropy_task {
            t.abort();
        }
    }

    /// The scrubber (None with `scrub.interval` zero).
    pub fn scrubber(&self) -> Option<&Arc<Scrubber>> {
        self.scrubber.as_ref()
    }

    /// Takes a checkpoint now (None without a store). Runs beside the loop's own: both go
    /// through the store, which gives each its own id under its write lock. Withheld
    /// ([`prefixlog_snapshot::StoreError::Withheld`]) once a record has failed to apply.
    pub fn checkpoint_now(&self) -> Result<Option<CheckpointMeta>, prefixlog_snapshot::StoreError> {
        let Some(store) = &self.store else { return Ok(None) };
        checkpoints::take(
            self.replica.applier(),
            store,
            &self.identity,
            &self.opts.checkpoints,
            &self.checkpoint_metrics,
        )
        .map(Some)
    }

    /// A clean stop: health NOT_SERVING (load balancers drain), stop consuming, a final
    /// checkpoint when a store is configured and anything was applied since the last one, let
    /// in-flight queries finish (for at most the shutdown grace), stop every task.
    pub async fn shutdown(mut self) -> Result<Stopped, NodeError> {
        self.query.readiness.set_stopping();
        for t in self.tasks.drain(..) {
            t.abort();
        }
        if let Some(s) = self.peer_stop.take() {
            let _ = s.send(());
        }
        let covered = self.checkpointer.take().map(Checkpointer::stop);
        let replica = self.replica.clone();
        tokio::task::spawn_blocking(move || replica.halt()).await?;
        let offsets = self.replica.applier().lock().offsets();
        let final_checkpoint = match (&self.store, covered) {
            (Some(_), Some(c)) if checkpoints::records_between(&c, &offsets) > 0 => {
                match self.checkpoint_now() {
                    // Logged and counted: a restart resumes from the last checkpoint written.
                    Err(prefixlog_snapshot::StoreError::Withheld(_)) => None,
                    r => r.map_err(NodeError::FinalCheckpoint)?,
                }
            }
            _ => None,
        };
        let grace = self.opts.shutdown_grace;
        self.query.shutdown(grace).await;
        tracing::info!(final_checkpoint = ?final_checkpoint.as_ref().map(|m| m.id), "replica stopped cleanly");
        Ok(Stopped { final_checkpoint, offsets })
    }

    /// An abrupt stop (a crashed replica, for tests): ports closed, nothing written, and —
    /// as when a process dies — everything released on return (the checkpoint store's lock).
    pub async fn kill(mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
        if let Some(c) = self.checkpointer.take() {
            c.stop();
        }
        self.query.kill();
        self.replica.halt();
    }
}

async fn start_query(
    spec: &LogSpec,
    opts: &NodeOptions,
    replica: &Arc<IngestThread>,
    registry: &Registry,
    admin: Option<AdminPort>,
) -> Result<RunningServer, NodeError> {
    let cfg = ServerConfig {
        grpc_addr: opts.grpc_addr,
        admin_addr: opts.admin_addr,
        ready_lag: opts.ready_lag,
        stale_after: opts.stale_after,
        query: opts.query.clone(),
        tls: opts.tls.clone(),
        extensions: opts.extensions.clone(),
    };
    let served = prefixlog_query::Served {
        engine: replica.applier().lock().engine().clone(),
        status: replica.status().clone(),
        applier: Some(replica.applier().clone()),
        info: prefixlog_query::ReplicaInfo {
            replica_id: opts.replica_id.clone(),
            topic: spec.topic.clone(),
            partition_count: spec.partitions,
            owned: spec.owned().to_vec(),
            shard: spec.shard.label(),
            peers: opts.peers.clone(),
        },
        registry: registry.clone(),
        admin,
    };
    Ok(prefixlog_query::start(cfg, served).await?)
}

/// The standard process metrics (`process_resident_memory_bytes`, ...), where the platform
/// has them.
fn register_process_metrics(registry: &Registry) {
    let pc = prometheus::process_collector::ProcessCollector::for_self();
    if let Err(e) = registry.register(Box::new(pc)) {
        tracing::debug!(error = %e, "process metrics unavailable");
    }
}

//! The `radix_index.RadixIndex` gRPC service and the extension that hosts it on the query
//! port. Every call is counted by RPC and status code (`protocol="smg"`; streams when they end).

use super::pb::radix_index_server::{RadixIndex, RadixIndexServer};
use super::pb::*;
use super::publish::{self, AckStream};
use super::state::{self, Filter};
use super::subscribe::{self, MatchOut};
use super::writer::Writer;
use super::{MAX_MESSAGE_BYTES, MAX_STREAMS, PROTOCOL, SERVICE_NAME};
use crate::metrics::FacadeMetrics;
use crate::start::{every_partition, StartError};
use crate::writers::{WriteRules, WriterPolicy};
use prefixlog_query::extension::{Extension, ExtensionContext, ExtensionError};
use prefixlog_query::QueryService;
use prefixlog_state::LogAppend;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::Stream;
use tonic::service::RoutesBuilder;
use tonic::{Request, Response, Status, Streaming};

/// A stream of synthetic updates (`Pull`, `PullHolders`).
pub type UpdateStream = Pin<Box<dyn Stream<Item = Result<Update, Status>> + Send>>;

/// The service over one replica. Cheap to clone.
#[derive(Clone)]
pub struct SmgService {
    writer: Arc<Writer>,
    query: QueryService,
    metrics: FacadeMetrics,
    /// One permit per open `Publish` or `Subscribe` stream ([`MAX_STREAMS`]).
    streams: Arc<Semaphore>,
    writers: WriterPolicy,
}

impl SmgService {
    pub fn new(log: Arc<dyn LogAppend>, query: QueryService, metrics: FacadeMetrics) -> Self {
        Self::with_rules(log, query, metrics, WriteRules::default())
    }

    /// The service writing under `rules` (who may write which holders, the epoch step).
    pub fn with_rules(
        log: Arc<dyn LogAppend>,
        query: QueryService,
        metrics: FacadeMetrics,
        rules: WriteRules,
    ) -> Self {
        let writer = Arc::new(Writer::with_max_epoch_step(log, query.clone(), rules.max_epoch_step));
        let streams = Arc::new(Semaphore::new(MAX_STREAMS));
        Self { writer, query, metrics, streams, writers: rules.writers }
    }

    /// A place for one more stream of `rpc`, or RESOURCE_EXHAUSTED (counted).
    fn stream_place(&self, rpc: &str) -> Result<OwnedSemaphorePermit, Status> {
        self.streams.clone().try_acquire_owned().map_err(|_| {
            self.metrics.skipped("streams_full", 1);
            self.metrics.request(rpc, tonic::Code::ResourceExhausted);
            Status::resource_exhausted(format!(
                "{MAX_STREAMS} Publish and Subscribe streams are open on this replica; retry later"
            ))
        })
    }

    /// `Publish` and `Subscribe` streams open now.
    pub fn open_streams(&self) -> usize {
        MAX_STREAMS - self.streams.available_permits()
    }

    pub fn into_server(self) -> RadixIndexServer<Self> {
        RadixIndexServer::new(self).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// The replica's state of `filter`'s holders as updates, one keyspace at a time (the
    /// stream waits for its reader between keyspaces' updates).
    fn pull(&self, rpc: &'static str, filter: Filter) -> Result<Response<UpdateStream>, Status> {
        self.ready(rpc)?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let query = self.query.clone();
        tokio::spawn(async move {
            for id in state::keyspaces(&query) {
                let (q, i, f) = (query.clone(), id.clone(), filter.clone());
                let Ok(updates) = tokio::task::spawn_blocking(move || state::updates(&q, &i, &f)).await
                else {
                    return;
                };
                for u in updates {
                    if tx.send(Ok(u)).await.is_err() {
                        return;
                    }
                }
            }
        });
        self.metrics.request(rpc, tonic::Code::Ok);
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    /// UNAVAILABLE (counted) while the replica is not ready: its state is not the log's yet.
    fn ready(&self, rpc: &str) -> Result<(), Status> {
        if self.query.view().readiness.is_ready() {
            return Ok(());
        }
        self.metrics.request(rpc, tonic::Code::Unavailable);
        Err(Status::unavailable("this replica is not ready (catching up with the log); ask another"))
    }
}

#[tonic::async_trait]
impl RadixIndex for SmgService {
    type PublishStream = AckStream;
    type SubscribeStream = MatchOut;
    type PullStream = UpdateStream;
    type PullHoldersStream = UpdateStream;

    async fn publish(&self, request: Request<Streaming<Update>>) -> Result<Response<AckStream>, Status> {
        crate::writes::seed_quotas(&self.writers, &self.query);
        let grant = self.writers.grant_for(&request).map_err(|e| {
            self.metrics.skipped(e.reason(), 1);
            self.metrics.request("Publish", e.status().code());
            e.status()
        })?;
        let place = self.stream_place("Publish")?;
        let inbound = request.into_inner();
        Ok(Response::new(publish::serve(self.writer.clone(), self.metrics.clone(), grant, inbound, place)))
    }

    async fn subscribe(&self, request: Request<Streaming<Query>>) -> Result<Response<MatchOut>, Status> {
        let place = self.stream_place("Subscribe")?;
        Ok(Response::new(subscribe::serve(
            self.query.clone(),
            self.metrics.clone(),
            request.into_inner(),
            place,
        )))
    }

    async fn pull(&self, _: Request<PullRequest>) -> Result<Response<UpdateStream>, Status> {
        SmgService::pull(self, "Pull", None)
    }

    async fn digests(&self, _: Request<PullRequest>) -> Result<Response<DigestsResponse>, Status> {
        self.ready("Digests")?;
        let query = self.query.clone();
        let holders = tokio::task::spawn_blocking(move || {
            state::keyspaces(&query).iter().flat_map(|id| state::digests(&query, id)).collect()
        })
        .await
        .map_err(|e| Status::internal(format!("digests: {e}")))?;
        self.metrics.request("Digests", tonic::Code::Ok);
        Ok(Response::new(DigestsResponse { holders }))
    }

    async fn pull_holders(
        &self,
        request: Request<PullHoldersRequest>,
    ) -> Result<Response<UpdateStream>, Status> {
        let filter = state::filter_of(&request.get_ref().holders);
        SmgService::pull(self, "PullHolders", filter)
    }
}

/// How start-up errors name this facade.
const FACADE: &str = "the SMG facade (--smg-radix-index)";

/// Hosts [`SmgService`] on the query port (`prefixlog serve --smg-radix-index`).
pub struct SmgExtension {
    log: Arc<dyn LogAppend>,
    rules: WriteRules,
}

impl SmgExtension {
    /// The extension appending its writes to `log` (over Kafka: a
    /// `prefixlog_ingest::Publisher` of its own), open to every writer.
    pub fn new(log: Arc<dyn LogAppend>) -> Self {
        Self { log, rules: WriteRules::default() }
    }

    /// The extension writing under `rules` (`serve --writer-tokens`, `--max-epoch-step`).
    pub fn with_rules(mut self, rules: WriteRules) -> Self {
        self.rules = rules;
        self
    }
}

impl Extension for SmgExtension {
    fn service_name(&self) -> &str {
        SERVICE_NAME
    }

    fn file_descriptor_set(&self) -> Option<&'static [u8]> {
        Some(crate::FILE_DESCRIPTOR_SET)
    }

    fn add_to(&self, ctx: &ExtensionContext<'_>, routes: &mut RoutesBuilder) -> Result<(), ExtensionError> {
        every_partition(ctx, FACADE)?;
        let metrics = FacadeMetrics::new(ctx.registry, PROTOCOL)
            .map_err(|source| StartError::Metrics { facade: FACADE, source })?;
        let svc = SmgService::with_rules(self.log.clone(), ctx.query.clone(), metrics, self.rules.clone());
        routes.add_service(svc.into_server());
        Ok(())
    }
}

//! The `kv_indexer.v1.KVIndexer` gRPC service and the extension that hosts it on the query
//! port. Every call is counted by RPC and status code (`protocol="sglang"`).

use super::pb::kv_indexer_server::{KvIndexer, KvIndexerServer};
use super::pb::*;
use super::reader::Reader;
use super::writer::Writer;
use super::{SglangConfig, MAX_MESSAGE_BYTES, PROTOCOL};
use crate::metrics::FacadeMetrics;
use crate::start::{every_partition, StartError};
use crate::writers::{Grant, WriteRules, WriterPolicy};
use prefixlog_query::extension::{Extension, ExtensionContext, ExtensionError};
use prefixlog_query::service::grpc_timeout;
use prefixlog_query::QueryService;
use prefixlog_state::LogAppend;
use std::sync::Arc;
use tonic::service::RoutesBuilder;
use tonic::{Request, Response, Status};

/// The service: a [`Writer`] and a [`Reader`] over one replica. Cheap to clone.
#[derive(Clone)]
pub struct SglangService {
    writer: Arc<Writer>,
    reader: Arc<Reader>,
    query: QueryService,
    metrics: FacadeMetrics,
    writers: WriterPolicy,
}

impl SglangService {
    pub fn new(
        cfg: &SglangConfig,
        log: Arc<dyn LogAppend>,
        query: QueryService,
        metrics: FacadeMetrics,
    ) -> Self {
        Self::with_writers(cfg, log, query, metrics, WriterPolicy::Open)
    }

    /// The service whose writes `writers` binds to the names each client may write.
    pub fn with_writers(
        cfg: &SglangConfig,
        log: Arc<dyn LogAppend>,
        query: QueryService,
        metrics: FacadeMetrics,
        writers: WriterPolicy,
    ) -> Self {
        Self {
            writer: Arc::new(Writer::new(cfg, log, query.clone())),
            reader: Arc::new(Reader::new(cfg, query.clone())),
            query,
            metrics,
            writers,
        }
    }

    /// What the caller may write (refusals counted by reason).
    fn grant<T>(&self, request: &Request<T>) -> Result<Grant, Status> {
        crate::writes::seed_quotas(&self.writers, &self.query);
        self.writers.grant_for(request).map_err(|e| {
            self.metrics.skipped(e.reason(), 1);
            e.status()
        })
    }

    /// A refused write's status, its reason counted (and by writer, when it is `grant`'s).
    fn refused(&self, grant: &Grant, e: super::writer::WriteError) -> Status {
        use super::batch::BatchError;
        use super::writer::WriteError;
        match &e {
            WriteError::Refused(r) => r.reason().into_iter().for_each(|why| self.metrics.skipped(why, 1)),
            WriteError::Denied(d) => {
                self.metrics.skipped(d.reason(), 1);
                if d.is_writers() {
                    self.metrics.writer_refused(grant.label(), d.reason());
                }
            }
            WriteError::SharedLimit(l) => {
                self.metrics.skipped(l.reason(), 1);
                self.metrics.writer_refused(grant.label(), l.reason());
            }
            WriteError::Batch(BatchError::BadName(_)) => self.metrics.skipped("bad_name", 1),
            _ => {}
        }
        e.status()
    }

    pub fn into_server(self) -> KvIndexerServer<Self> {
        KvIndexerServer::new(self).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Counts the call's outcome and hands it back.
    fn counted<T>(&self, rpc: &str, r: Result<T, Status>) -> Result<Response<T>, Status> {
        self.metrics.request(rpc, r.as_ref().err().map_or(tonic::Code::Ok, Status::code));
        r.map(Response::new)
    }
}

#[tonic::async_trait]
impl KvIndexer for SglangService {
    async fn configure_expected_workers(
        &self,
        request: Request<ConfigureExpectedWorkersRequest>,
    ) -> Result<Response<ConfigureExpectedWorkersResponse>, Status> {
        let wait = self.query.wait_for_call(grpc_timeout(&request));
        let grant = match self.grant(&request) {
            Ok(g) => g,
            Err(s) => return self.counted("ConfigureExpectedWorkers", Err(s)),
        };
        let r = super::fleet::configure(&self.writer, request.get_ref(), &grant, wait).await;
        let r = match r {
            Ok((response, mismatched)) => {
                self.metrics.skipped("worker_id_mismatch", mismatched);
                Ok(response)
            }
            Err(e) => Err(self.refused(&grant, e)),
        };
        self.counted("ConfigureExpectedWorkers", r)
    }

    async fn replace_external_kv_snapshot(
        &self,
        _: Request<ReplaceExternalKvSnapshotRequest>,
    ) -> Result<Response<ReplaceExternalKvSnapshotResponse>, Status> {
        let why = "ReplaceExternalKvSnapshot is not served: a snapshot's flat per-tier hash lists carry no \
                   parents, which prefixlog cannot place; run `prefixlog bridge` for recovery-aware fleets";
        self.counted("ReplaceExternalKvSnapshot", Err(Status::unimplemented(why)))
    }

    async fn apply_external_kv_batch(
        &self,
        request: Request<ApplyExternalKvBatchRequest>,
    ) -> Result<Response<ApplyExternalKvBatchResponse>, Status> {
        let wait = self.query.wait_for_call(grpc_timeout(&request));
        let grant = match self.grant(&request) {
            Ok(g) => g,
            Err(s) => return self.counted("ApplyExternalKvBatch", Err(s)),
        };
        let req = request.into_inner();
        let worker = crate::names::worker_id(crate::names::SGLANG_SEED, &req.worker_id);
        let admitted = grant.check(&req.worker_id).and_then(|()| grant.admit(worker, self.writer.keyspace()));
        if let Err(e) = admitted {
            return self.counted("ApplyExternalKvBatch", Err(self.refused(&grant, e.into())));
        }
        let r = match self.writer.write(&req, wait).await {
            Ok(w) => {
                for (reason, n) in w.skipped.reasons() {
                    self.metrics.skipped(reason, n);
                }
                if !w.applied {
                    tracing::debug!(worker = %req.worker_id, ?wait, "batch on the log, not applied here within the wait");
                }
                if w.duplicate {
                    self.metrics.skipped("stale_seq", 1);
                }
                Ok(ApplyExternalKvBatchResponse { applied_seq: req.seq, duplicate: w.duplicate })
            }
            Err(e) => Err(self.refused(&grant, e)),
        };
        self.counted("ApplyExternalKvBatch", r)
    }

    async fn match_external_kv(
        &self,
        request: Request<MatchExternalKvRequest>,
    ) -> Result<Response<MatchExternalKvResponse>, Status> {
        let wait = self.query.wait_for_call(grpc_timeout(&request));
        let r = self.reader.match_hashes(request.get_ref(), wait).await.map(|(resp, dropped)| {
            self.metrics.skipped("hit_counts_full", dropped.0);
            resp
        });
        self.counted("MatchExternalKv", r)
    }

    async fn match_external_kv_prefix(
        &self,
        request: Request<MatchExternalKvPrefixRequest>,
    ) -> Result<Response<MatchExternalKvPrefixResponse>, Status> {
        let wait = self.query.wait_for_call(grpc_timeout(&request));
        let r = self.reader.match_prefix(request.get_ref(), wait).await;
        self.counted("MatchExternalKvPrefix", r)
    }

    async fn get_external_kv_hit_counts(
        &self,
        request: Request<GetExternalKvHitCountsRequest>,
    ) -> Result<Response<GetExternalKvHitCountsResponse>, Status> {
        let r = self.reader.hit_counts(request.get_ref());
        self.counted("GetExternalKvHitCounts", r)
    }
}

/// How start-up errors name this facade.
const FACADE: &str = "the SGLang facade (--sgl-model)";

/// Hosts [`SglangService`] on the query port (`prefixlog serve --sgl-model ...`).
pub struct SglangExtension {
    cfg: SglangConfig,
    log: Arc<dyn LogAppend>,
    rules: WriteRules,
}

impl SglangExtension {
    /// The extension for `cfg`, appending its writes to `log` (over Kafka: a
    /// `prefixlog_ingest::Publisher` of its own), open to every writer.
    pub fn new(cfg: SglangConfig, log: Arc<dyn LogAppend>) -> Self {
        Self { cfg, log, rules: WriteRules::default() }
    }

    /// The extension writing under `rules` (`serve --writer-tokens`). SGLang's worker epochs
    /// are the facade's own (docs/compat/sglang.md), so only the writer policy applies.
    pub fn with_rules(mut self, rules: WriteRules) -> Self {
        self.rules = rules;
        self
    }
}

impl Extension for SglangExtension {
    fn service_name(&self) -> &str {
        "kv_indexer.v1.KVIndexer"
    }

    fn file_descriptor_set(&self) -> Option<&'static [u8]> {
        Some(crate::FILE_DESCRIPTOR_SET)
    }

    fn add_to(&self, ctx: &ExtensionContext<'_>, routes: &mut RoutesBuilder) -> Result<(), ExtensionError> {
        every_partition(ctx, FACADE)?;
        let metrics = FacadeMetrics::new(ctx.registry, PROTOCOL)
            .map_err(|source| StartError::Metrics { facade: FACADE, source })?;
        let writers = self.rules.writers.clone();
        let svc =
            SglangService::with_writers(&self.cfg, self.log.clone(), ctx.query.clone(), metrics, writers);
        routes.add_service(svc.into_server());
        Ok(())
    }
}

//! The `ReplicaPeer` server: digest points (with the state settings and covered partitions, so
//! peers compare only like with like), per-holder digests, and checkpoint exports (whole or
//! filtered to some partitions).

use crate::client::MAX_MESSAGE_BYTES;
use crate::transfer::{ServeLimits, Transfers};
use parking_lot::Mutex;
use prefixlog_engine::partition_of;
use prefixlog_proto::v1 as pb;
use prefixlog_proto::v1::replica_peer_server::{ReplicaPeer, ReplicaPeerServer};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::{Applier, LogIdentity};
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Holders listed by one `HolderDigests` answer at most (a lead for a mismatch's log line,
/// not a verdict): about 100 bytes each, so the answer stays under the message cap.
pub const MAX_HOLDER_DIGESTS: usize = 20_000;

#[derive(Clone)]
pub struct PeerService {
    applier: Arc<Mutex<Applier>>,
    store: Option<Arc<CheckpointStore>>,
    replica_id: String,
    identity: LogIdentity,
    transfers: Transfers,
}

impl PeerService {
    pub fn new(
        applier: Arc<Mutex<Applier>>,
        store: Option<Arc<CheckpointStore>>,
        replica_id: String,
        identity: LogIdentity,
        limits: ServeLimits,
    ) -> Self {
        Self { applier, store, replica_id, identity, transfers: Transfers::new(limits) }
    }

    /// The service, with requests and answers capped at [`MAX_MESSAGE_BYTES`].
    pub fn into_server(self) -> ReplicaPeerServer<Self> {
        ReplicaPeerServer::new(self)
            .max_decoding_message_size(1 << 20)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn owned_or_invalid(&self, p: u32) -> Result<(), Status> {
        if self.identity.owned.binary_search(&p).is_ok() {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "partition {p} is not owned by this replica (it owns {:?} of {})",
            self.identity.owned, self.identity.partitions
        )))
    }
}

pub(crate) fn keyspace(id: &prefixlog_engine::KeyspaceId) -> pb::Keyspace {
    pb::Keyspace { model: id.model.clone(), block_size: id.block_size, hash_scheme: id.scheme }
}

type ChunkStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::CheckpointChunk, Status>> + Send>>;

#[tonic::async_trait]
impl ReplicaPeer for PeerService {
    async fn digests(
        &self,
        req: Request<pb::DigestsRequest>,
    ) -> Result<Response<pb::DigestsResponse>, Status> {
        let want: Vec<u32> = match &req.get_ref().partitions[..] {
            [] => self.identity.owned.clone(),
            some => some.to_vec(),
        };
        for &p in &want {
            self.owned_or_invalid(p)?;
        }
        let a = self.applier.lock();
        let partitions = want
            .into_iter()
            .map(|p| pb::PartitionDigests {
                partition: p,
                next_offset: a.partition(p).next_offset,
                points: a
                    .digest_points(p)
                    .map(|d| pb::DigestPointMsg {
                        next_offset: d.next_offset,
                        log_time: d.log_time,
                        digest: d.digest,
                    })
                    .collect(),
            })
            .collect();
        drop(a);
        let id = &self.identity;
        Ok(Response::new(pb::DigestsResponse {
            replica_id: self.replica_id.clone(),
            topic: id.topic.clone(),
            partition_count: id.partitions,
            partitions,
            settings: id.settings.encode(),
            settings_fingerprint: id.settings.fingerprint(),
            owned_partitions: id.owned.clone(),
            cluster_id: id.cluster_id.clone(),
        }))
    }

    async fn holder_digests(
        &self,
        req: Request<pb::HolderDigestsRequest>,
    ) -> Result<Response<pb::HolderDigestsResponse>, Status> {
        let p = req.get_ref().partition;
        self.owned_or_invalid(p)?;
        let n = self.identity.partitions;
        // Only the partition's own state under the applier lock; the keyspaces are read under
        // their own locks, so ingest does not wait for the scan.
        let (engine, next_offset, feeds) = {
            let a = self.applier.lock();
            let feeds: Vec<pb::FeedStateMsg> = a
                .partition(p)
                .feeds
                .iter()
                .take(MAX_HOLDER_DIGESTS)
                .map(|(k, f)| pb::FeedStateMsg {
                    keyspace: Some(keyspace(&k.keyspace)),
                    worker: k.worker,
                    dp_rank: k.dp_rank,
                    epoch: f.epoch,
                    last_seq: f.last_seq,
                })
                .collect();
            (a.engine().clone(), a.partition(p).next_offset, feeds)
        };
        let mut truncated = feeds.len() >= MAX_HOLDER_DIGESTS;
        let mut holders = Vec::new();
        'scan: for ks in engine.keyspaces() {
            let g = ks.read();
            for h in g.holder_summaries().into_iter().filter(|h| partition_of(h.key.worker, n) == p) {
                if holders.len() >= MAX_HOLDER_DIGESTS {
                    truncated = true;
                    break 'scan;
                }
                holders.push(pb::HolderDigestMsg {
                    keyspace: Some(keyspace(g.id())),
                    worker: h.key.worker,
                    dp_rank: h.key.dp_rank,
                    lane: h.key.lane,
                    blocks: h.blocks,
                    digest: h.digest,
                    fed: h.fed,
                    gapped: h.gapped,
                });
            }
        }
        Ok(Response::new(pb::HolderDigestsResponse { next_offset, holders, feeds, truncated }))
    }

    type FetchCheckpointStream = ChunkStream;

    async fn fetch_checkpoint(
        &self,
        req: Request<pb::FetchCheckpointRequest>,
    ) -> Result<Response<Self::FetchCheckpointStream>, Status> {
        let store = self.store.clone().ok_or_else(|| {
            Status::failed_precondition("this replica keeps no checkpoints (no --data-dir)")
        })?;
        let partitions = req.into_inner().partitions;
        for &p in &partitions {
            self.owned_or_invalid(p)?;
        }
        let slot = self.transfers.slot()?;
        let id = *store.ids().first().ok_or_else(|| Status::unavailable("no checkpoint taken yet"))?;
        let rx = self.transfers.start(slot, store, id, partitions);
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}

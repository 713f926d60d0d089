//! The `ReplicaPeer` server.

use parking_lot::Mutex;
use prefixlog_engine::partition_of;
use prefixlog_ingest::Applier;
use prefixlog_proto::v1 as pb;
use prefixlog_proto::v1::replica_peer_server::{ReplicaPeer, ReplicaPeerServer};
use prefixlog_snapshot::CheckpointStore;
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Request, Response, Status};

const CHUNK: usize = 1 << 20;

#[derive(Clone)]
pub struct PeerService {
    pub applier: Arc<Mutex<Applier>>,
    pub store: Option<Arc<CheckpointStore>>,
    pub replica_id: String,
    pub topic: String,
}

impl PeerService {
    pub fn into_server(self) -> ReplicaPeerServer<Self> {
        ReplicaPeerServer::new(self).max_decoding_message_size(1 << 20)
    }
}

fn keyspace(id: &prefixlog_engine::KeyspaceId) -> pb::Keyspace {
    pb::Keyspace { model: id.model.clone(), block_size: id.block_size, hash_scheme: id.scheme }
}

type ChunkStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::CheckpointChunk, Status>> + Send>>;

#[tonic::async_trait]
impl ReplicaPeer for PeerService {
    async fn digests(
        &self,
        req: Request<pb::DigestsRequest>,
    ) -> Result<Response<pb::DigestsResponse>, Status> {
        let a = self.applier.lock();
        let n = a.config().partitions;
        let want: Vec<u32> = if req.get_ref().partitions.is_empty() {
            (0..n).collect()
        } else {
            req.get_ref().partitions.clone()
        };
        let mut partitions = Vec::with_capacity(want.len());
        for p in want {
            if p >= n {
                return Err(Status::invalid_argument(format!("partition {p} does not exist (0..{n})")));
            }
            partitions.push(pb::PartitionDigests {
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
            });
        }
        Ok(Response::new(pb::DigestsResponse {
            replica_id: self.replica_id.clone(),
            topic: self.topic.clone(),
            partition_count: n,
            partitions,
        }))
    }

    async fn holder_digests(
        &self,
        req: Request<pb::HolderDigestsRequest>,
    ) -> Result<Response<pb::HolderDigestsResponse>, Status> {
        let p = req.get_ref().partition;
        let a = self.applier.lock();
        let n = a.config().partitions;
        if p >= n {
            return Err(Status::invalid_argument(format!("partition {p} does not exist (0..{n})")));
        }
        let mut holders = Vec::new();
        for ks in a.engine().keyspaces() {
            let g = ks.read();
            for h in g.holder_summaries().into_iter().filter(|h| partition_of(h.key.worker, n) == p) {
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
        let feeds = a
            .partition(p)
            .feeds
            .iter()
            .map(|(k, f)| pb::FeedStateMsg {
                keyspace: Some(keyspace(&k.keyspace)),
                worker: k.worker,
                dp_rank: k.dp_rank,
                epoch: f.epoch,
                last_seq: f.last_seq,
            })
            .collect();
        Ok(Response::new(pb::HolderDigestsResponse {
            next_offset: a.partition(p).next_offset,
            holders,
            feeds,
        }))
    }

    type FetchCheckpointStream = ChunkStream;

    async fn fetch_checkpoint(
        &self,
        _req: Request<pb::FetchCheckpointRequest>,
    ) -> Result<Response<Self::FetchCheckpointStream>, Status> {
        let store = self.store.clone().ok_or_else(|| {
            Status::failed_precondition("this replica keeps no checkpoints (no --data-dir)")
        })?;
        let data = tokio::task::spawn_blocking(move || {
            let id = *store.ids().first().ok_or_else(|| Status::unavailable("no checkpoint taken yet"))?;
            store.export(id).map(|d| (id, d)).map_err(|e| Status::internal(format!("checkpoint {id}: {e}")))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        let (id, data) = data;
        let total = xxhash_rust::xxh3::xxh3_64(&data);
        let n = data.len();
        let chunks: Vec<Result<pb::CheckpointChunk, Status>> = data
            .chunks(CHUNK)
            .enumerate()
            .map(|(i, c)| {
                let last = (i + 1) * CHUNK >= n;
                Ok(pb::CheckpointChunk {
                    checkpoint_id: id,
                    total_bytes: n as u64,
                    data: c.to_vec(),
                    chunk_checksum: xxhash_rust::xxh3::xxh3_64(c),
                    last,
                    total_checksum: if last { total } else { 0 },
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }
}

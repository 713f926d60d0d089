//! Bootstrap of a new replica: fetch a running peer's newest checkpoint (chunked, every chunk
//! and the whole checksummed) and store it locally; the replica then restores it and replays
//! only the tail, so the log need not be retained from the beginning.

use prefixlog_proto::v1 as pb;
use prefixlog_proto::v1::replica_peer_client::ReplicaPeerClient;
use prefixlog_snapshot::{CheckpointMeta, CheckpointStore};
use xxhash_rust::xxh3::xxh3_64;

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("peer {peer}: {source}")]
    Connect { peer: String, source: tonic::transport::Error },
    #[error("peer {peer}: {status}")]
    Rpc { peer: String, status: tonic::Status },
    #[error("peer {peer}: transfer corrupt: {what}")]
    Corrupt { peer: String, what: String },
    #[error("storing the fetched checkpoint: {0}")]
    Store(#[from] prefixlog_snapshot::StoreError),
}

pub async fn fetch_checkpoint(peer: &str, store: &CheckpointStore) -> Result<CheckpointMeta, BootstrapError> {
    let url = if peer.contains("://") { peer.to_string() } else { format!("http://{peer}") };
    let mut client = ReplicaPeerClient::connect(url)
        .await
        .map_err(|source| BootstrapError::Connect { peer: peer.into(), source })?
        .max_decoding_message_size(4 << 20);
    let rpc = |status| BootstrapError::Rpc { peer: peer.into(), status };
    let mut stream = client.fetch_checkpoint(pb::FetchCheckpointRequest {}).await.map_err(rpc)?.into_inner();
    let corrupt = |what: String| BootstrapError::Corrupt { peer: peer.into(), what };
    let mut data = Vec::new();
    let mut done = false;
    while let Some(c) = stream.message().await.map_err(rpc)? {
        if xxh3_64(&c.data) != c.chunk_checksum {
            return Err(corrupt(format!("chunk at byte {} fails its checksum", data.len())));
        }
        data.extend_from_slice(&c.data);
        if c.last {
            if data.len() as u64 != c.total_bytes || xxh3_64(&data) != c.total_checksum {
                return Err(corrupt("whole-checkpoint checksum mismatch".into()));
            }
            done = true;
            break;
        }
    }
    if !done {
        return Err(corrupt(format!("stream ended after {} bytes without its last chunk", data.len())));
    }
    Ok(store.import(&data)?)
}

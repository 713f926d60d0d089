//! Fetching a peer's checkpoint (chunked, every chunk and the whole checksummed): bootstrap of
//! a new replica, a new shard's partitions when resharding, and recovery of a partition whose
//! log no longer continues its state.

use prefixlog_ingest::{check_compatible, Incompatible, LogIdentity};
use prefixlog_proto::v1 as pb;
use prefixlog_proto::v1::replica_peer_client::ReplicaPeerClient;
use prefixlog_snapshot::{decode_export, CheckpointMeta, CheckpointStore, Loaded, StoreError};
use std::time::Duration;
use tonic::transport::ClientTlsConfig;
use xxhash_rust::xxh3::xxh3_64;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("peer {peer}: {source}")]
    Connect { peer: String, source: tonic::transport::Error },
    #[error("peer {peer}: {status}")]
    Rpc { peer: String, status: tonic::Status },
    #[error("peer {peer}: transfer corrupt: {what}")]
    Corrupt { peer: String, what: String },
    #[error("peer {peer}: the checkpoint it sent: {source}")]
    Store { peer: String, source: StoreError },
    #[error("peer {peer}: its checkpoint cannot stand for ours: {why}")]
    Incompatible { peer: String, why: Incompatible },
}

pub(crate) fn url(peer: &str, tls: bool) -> String {
    match (peer.contains("://"), tls) {
        (true, _) => peer.to_string(),
        (false, true) => format!("https://{peer}"),
        (false, false) => format!("http://{peer}"),
    }
}

/// Connects to a peer's `ReplicaPeer` service (over mutual TLS when `tls` is given).
pub async fn connect(
    peer: &str,
    tls: Option<&ClientTlsConfig>,
) -> Result<ReplicaPeerClient<tonic::transport::Channel>, FetchError> {
    let bad = |source| FetchError::Connect { peer: peer.into(), source };
    let mut endpoint = tonic::transport::Endpoint::from_shared(url(peer, tls.is_some())).map_err(bad)?;
    if let Some(t) = tls {
        endpoint = endpoint.tls_config(t.clone()).map_err(bad)?;
    }
    let endpoint = endpoint.connect_timeout(Duration::from_secs(2));
    let channel =
        endpoint.connect().await.map_err(|source| FetchError::Connect { peer: peer.into(), source })?;
    Ok(ReplicaPeerClient::new(channel).max_decoding_message_size(4 << 20))
}

/// The peer's newest checkpoint as export bytes, holding `partitions` (empty: all it owns).
pub async fn fetch_export(
    peer: &str,
    tls: Option<&ClientTlsConfig>,
    partitions: &[u32],
) -> Result<Vec<u8>, FetchError> {
    let mut client = connect(peer, tls).await?;
    let rpc = |status| FetchError::Rpc { peer: peer.into(), status };
    let req = pb::FetchCheckpointRequest { partitions: partitions.to_vec() };
    let mut stream = client.fetch_checkpoint(req).await.map_err(rpc)?.into_inner();
    let corrupt = |what: String| FetchError::Corrupt { peer: peer.into(), what };
    let mut data = Vec::new();
    while let Some(c) = stream.message().await.map_err(rpc)? {
        if xxh3_64(&c.data) != c.chunk_checksum {
            return Err(corrupt(format!("chunk at byte {} fails its checksum", data.len())));
        }
        data.extend_from_slice(&c.data);
        if c.last {
            if data.len() as u64 != c.total_bytes || xxh3_64(&data) != c.total_checksum {
                return Err(corrupt("whole-checkpoint checksum mismatch".into()));
            }
            return Ok(data);
        }
    }
    Err(corrupt(format!("stream ended after {} bytes without its last chunk", data.len())))
}

/// Fetches the peer's newest checkpoint of `need` partitions, verified and checked against the
/// one compatibility rule for a replica of `ours`.
pub async fn fetch_checkpoint(
    peer: &str,
    tls: Option<&ClientTlsConfig>,
    ours: &LogIdentity,
    need: &[u32],
) -> Result<Loaded, FetchError> {
    let data = fetch_export(peer, tls, need).await?;
    let loaded = decode_export(&data).map_err(|source| FetchError::Store { peer: peer.into(), source })?;
    check_compatible(ours, &loaded.meta.identity, need)
        .map_err(|why| FetchError::Incompatible { peer: peer.into(), why })?;
    Ok(loaded)
}

/// [`fetch_checkpoint`], then stored in `store` under a new local id (bootstrap).
pub async fn fetch_into_store(
    peer: &str,
    tls: Option<&ClientTlsConfig>,
    ours: &LogIdentity,
    need: &[u32],
    store: &CheckpointStore,
) -> Result<CheckpointMeta, FetchError> {
    let data = fetch_export(peer, tls, need).await?;
    let loaded = decode_export(&data).map_err(|source| FetchError::Store { peer: peer.into(), source })?;
    check_compatible(ours, &loaded.meta.identity, need)
        .map_err(|why| FetchError::Incompatible { peer: peer.into(), why })?;
    store.import(&data).map_err(|source| FetchError::Store { peer: peer.into(), source })
}

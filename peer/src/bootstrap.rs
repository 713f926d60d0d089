//! Fetching a peer's checkpoint (chunked, every chunk and the whole checksummed, with a stall
//! deadline and a size cap): bootstrap of a new replica, a new shard's partitions when
//! resharding, and recovery of a partition whose log no longer continues its state.

use crate::client::{CallError, PeerClient};
use prefixlog_proto::v1 as pb;
use prefixlog_snapshot::{decode_export, CheckpointMeta, CheckpointStore, Loaded, StoreError};
use prefixlog_state::{check_compatible, Incompatible, LogIdentity};
use xxhash_rust::xxh3::Xxh3;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("peer {peer}: its checkpoint is {bytes} bytes, more than the {max} this replica accepts")]
    TooLarge { peer: String, bytes: u64, max: u64 },
    #[error("peer {peer}: transfer corrupt: {what}")]
    Corrupt { peer: String, what: String },
    #[error("peer {peer}: the checkpoint it sent: {source}")]
    Store { peer: String, source: StoreError },
    #[error("peer {peer}: its checkpoint cannot stand for ours: {why}")]
    Incompatible { peer: String, why: Incompatible },
}

impl FetchError {
    /// The peer is serving as many checkpoint transfers as it allows: try another, or later.
    pub fn is_busy(&self) -> bool {
        matches!(self, FetchError::Call(e) if e.is_busy())
    }
}

impl PeerClient {
    /// The peer's newest checkpoint as export bytes, holding `partitions` (empty: all it owns).
    pub async fn fetch_export(&self, peer: &str, partitions: &[u32]) -> Result<Vec<u8>, FetchError> {
        let mut client = self.connect(peer).await?;
        let rpc = |status| CallError::rpc(peer, status);
        let req = pb::FetchCheckpointRequest { partitions: partitions.to_vec() };
        let call = client.fetch_checkpoint(req);
        let mut stream =
            self.deadline(peer, "starting a checkpoint transfer", call).await?.map_err(rpc)?.into_inner();
        let corrupt = |what: String| FetchError::Corrupt { peer: peer.into(), what };
        let (mut data, mut whole) = (Vec::new(), Xxh3::new());
        loop {
            let next = tokio::time::timeout(self.stall_timeout, stream.message()).await.map_err(|_| {
                CallError::Timeout {
                    peer: peer.into(),
                    what: "waiting for a checkpoint chunk",
                    after: self.stall_timeout,
                }
            })?;
            let Some(c) = next.map_err(rpc)? else {
                return Err(corrupt(format!(
                    "stream ended after {} bytes without its last chunk",
                    data.len()
                )));
            };
            if c.total_bytes > self.max_checkpoint_bytes {
                return Err(FetchError::TooLarge {
                    peer: peer.into(),
                    bytes: c.total_bytes,
                    max: self.max_checkpoint_bytes,
                });
            }
            if xxhash_rust::xxh3::xxh3_64(&c.data) != c.chunk_checksum {
                return Err(corrupt(format!("chunk at byte {} fails its checksum", data.len())));
            }
            if (data.len() + c.data.len()) as u64 > c.total_bytes {
                return Err(corrupt(format!("more than the {} bytes announced", c.total_bytes)));
            }
            whole.update(&c.data);
            data.extend_from_slice(&c.data);
            if c.last {
                if data.len() as u64 != c.total_bytes || whole.digest() != c.total_checksum {
                    return Err(corrupt("whole-checkpoint checksum mismatch".into()));
                }
                return Ok(data);
            }
        }
    }

    /// Fetches the peer's newest checkpoint of `need` partitions, verified and checked against
    /// the one compatibility rule for a replica of `ours`.
    pub async fn fetch_checkpoint(
        &self,
        peer: &str,
        ours: &LogIdentity,
        need: &[u32],
    ) -> Result<Loaded, FetchError> {
        let data = self.fetch_export(peer, need).await?;
        let loaded =
            decode_export(&data).map_err(|source| FetchError::Store { peer: peer.into(), source })?;
        check_compatible(ours, &loaded.meta.identity, need)
            .map_err(|why| FetchError::Incompatible { peer: peer.into(), why })?;
        Ok(loaded)
    }

    /// [`Self::fetch_checkpoint`], then stored in `store` under a new local id (bootstrap).
    pub async fn fetch_into_store(
        &self,
        peer: &str,
        ours: &LogIdentity,
        need: &[u32],
        store: &CheckpointStore,
    ) -> Result<CheckpointMeta, FetchError> {
        let data = self.fetch_export(peer, need).await?;
        let loaded =
            decode_export(&data).map_err(|source| FetchError::Store { peer: peer.into(), source })?;
        check_compatible(ours, &loaded.meta.identity, need)
            .map_err(|why| FetchError::Incompatible { peer: peer.into(), why })?;
        store.import(&data).map_err(|source| FetchError::Store { peer: peer.into(), source })
    }
}

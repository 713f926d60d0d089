//! [`PeerClient`]: how a replica calls its peers — mutual TLS when configured, a deadline on
//! every call, a size cap on every answer. Anti-entropy, bootstrap and recovery all call
//! through it, so none of them can hang on a peer or be made to take unbounded memory.

use prefixlog_proto::v1::replica_peer_client::ReplicaPeerClient;
use std::future::Future;
use std::time::Duration;
use tonic::transport::{Channel, ClientTlsConfig};

/// The largest single message a peer may send (a digest list, a holder-digest list, one
/// checkpoint chunk of 1 MiB); a larger one fails the call.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The largest checkpoint accepted from a peer, in bytes (a transfer announcing more is
/// refused before its first chunk; one sending more than it announced is corrupt).
pub const MAX_CHECKPOINT_BYTES: u64 = 64 << 30;

/// A call to a peer that did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("peer {peer}: {source}")]
    Connect { peer: String, source: tonic::transport::Error },
    #[error("peer {peer}: {status}")]
    Rpc { peer: String, status: tonic::Status },
    #[error("peer {peer}: {what} took longer than {after:?}")]
    Timeout { peer: String, what: &'static str, after: Duration },
}

impl CallError {
    pub fn rpc(peer: &str, status: tonic::Status) -> Self {
        CallError::Rpc { peer: peer.into(), status }
    }

    /// The peer is serving as many checkpoint transfers as it allows: try another, or later.
    pub fn is_busy(&self) -> bool {
        matches!(self, CallError::Rpc { status, .. } if status.code() == tonic::Code::ResourceExhausted)
    }
}

/// How a replica calls its peers.
#[derive(Clone, Debug)]
pub struct PeerClient {
    /// Mutual TLS, when the peer port requires it (`serve --peer-tls-*`).
    pub tls: Option<ClientTlsConfig>,
    /// Deadline of one call for digests or holder digests, connecting included.
    pub call_timeout: Duration,
    /// A checkpoint transfer in which no chunk arrives for this long is abandoned (a large
    /// partition-filtered export takes the peer a while before its first chunk).
    pub stall_timeout: Duration,
    pub max_checkpoint_bytes: u64,
}

impl Default for PeerClient {
    fn default() -> Self {
        Self {
            tls: None,
            call_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(120),
            max_checkpoint_bytes: MAX_CHECKPOINT_BYTES,
        }
    }
}

pub(crate) fn url(peer: &str, tls: bool) -> String {
    match (peer.contains("://"), tls) {
        (true, _) => peer.to_string(),
        (false, true) => format!("https://{peer}"),
        (false, false) => format!("http://{peer}"),
    }
}

impl PeerClient {
    pub fn with_tls(tls: Option<ClientTlsConfig>) -> Self {
        Self { tls, ..Self::default() }
    }

    /// Connects to a peer's `ReplicaPeer` service (over mutual TLS when configured), within
    /// the call deadline.
    pub async fn connect(&self, peer: &str) -> Result<ReplicaPeerClient<Channel>, CallError> {
        let bad = |source| CallError::Connect { peer: peer.into(), source };
        let mut endpoint =
            tonic::transport::Endpoint::from_shared(url(peer, self.tls.is_some())).map_err(bad)?;
        if let Some(t) = &self.tls {
            endpoint = endpoint.tls_config(t.clone()).map_err(bad)?;
        }
        let endpoint = endpoint.connect_timeout(self.call_timeout);
        let channel = self.deadline(peer, "connecting", endpoint.connect()).await?.map_err(bad)?;
        Ok(ReplicaPeerClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// `call` within the call deadline.
    pub async fn deadline<T>(
        &self,
        peer: &str,
        what: &'static str,
        call: impl Future<Output = T>,
    ) -> Result<T, CallError> {
        tokio::time::timeout(self.call_timeout, call).await.map_err(|_| CallError::Timeout {
            peer: peer.into(),
            what,
            after: self.call_timeout,
        })
    }
}

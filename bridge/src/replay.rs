//! Asking an engine for the messages a bridge missed, over its replay (ROUTER) socket.
//!
//! A DEALER socket speaking the REQ envelope (an empty delimiter frame, then the 8-byte
//! big-endian start seq), because the engine answers one request with many messages
//! (`[seq, payload]`…, then `[-1, b""]`), which a strict REQ socket cannot receive.

use crate::wire;
use bytes::Bytes;
use std::time::Duration;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// What a replay request returned: `(seq, payload)` in the engine's order.
pub type Replayed = Vec<(u64, Bytes)>;

/// Requests messages from `start` over the engine's replay socket; reads until the end marker.
pub async fn request_replay(endpoint: &str, start: u64, timeout: Duration) -> anyhow::Result<Replayed> {
    let endpoint = endpoint.to_string();
    // The socket runs in its own task: the zeromq crate panics (todo!) on some peer errors.
    let task = tokio::spawn(async move {
        let mut s = DealerSocket::new();
        s.connect(&endpoint).await?;
        let mut req = ZmqMessage::from(Bytes::new());
        req.push_back(Bytes::copy_from_slice(&start.to_be_bytes()));
        s.send(req).await?;
        let mut out = Vec::new();
        loop {
            let frames = s.recv().await?.into_vec();
            // Strip the REQ envelope's empty delimiter.
            let f = match frames.first() {
                Some(d) if d.is_empty() => &frames[1..],
                _ => &frames[..],
            };
            let [seq, payload] = f else {
                anyhow::bail!("replay answer with {} frames, expected 2", f.len());
            };
            if seq.as_ref() == (-1i64).to_be_bytes() {
                return Ok(out);
            }
            out.push((wire::decode_seq(seq)?, payload.clone()));
        }
    });
    let abort = task.abort_handle();
    match tokio::time::timeout(timeout, task).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => anyhow::bail!("replay task failed: {e}"),
        Err(_) => {
            abort.abort();
            anyhow::bail!("replay timed out after {timeout:?}")
        }
    }
}

//! Asking an engine for the messages a bridge missed, over its replay (ROUTER) socket.
//!
//! The request is the REQ envelope (an empty delimiter frame, then the 8-byte big-endian start
//! seq), sent from a DEALER socket because the engine answers one request with many messages.
//! vLLM (0.34) and SGLang (0.5.23) answer, for every buffered message from the start seq on,
//! `["", topic, seq, payload]` — the same three frames as the live stream after the delimiter
//! — and end with `["", "", 0xFFFFFFFFFFFFFFFF, ""]` (seq -1 as 8 signed big-endian bytes).
//! Older publishers (and this project's earlier stand-in) sent `[seq, payload]` without the
//! topic: both shapes are read. Messages whose topic does not start with the stream's
//! subscription prefix are left out, as the live subscription would.
//!
//! Bounded: the answer is read for at most `timeout`, each frame within `max_frame_bytes`, and
//! all of it within `max_bytes`: each message may declare at most what is left of that budget,
//! checked before anything is reserved for it ([`zmtp::Connection::set_limits`]); past a cap
//! or the time the replay fails (the caller then starts the stream over).

use crate::wire;
use crate::zmtp::{self, Endpoint, SocketType, ZmtpError};
use bytes::Bytes;
use std::time::Duration;

/// What a replay request returned: `(seq, payload)` in the engine's order.
pub type Replayed = Vec<(u64, Bytes)>;

/// The end-of-replay marker's sequence frame.
pub const END_SEQ: [u8; 8] = [0xFF; 8];

/// The bounds of one replay request and the stream's subscription prefix.
#[derive(Clone, Debug)]
pub struct ReplayLimits {
    pub timeout: Duration,
    /// Most bytes of frames the answer may bring.
    pub max_bytes: usize,
    /// Most bytes of one frame (a message: this plus [`zmtp::codec::MESSAGE_ROOM`]).
    pub max_frame_bytes: usize,
    /// Only messages whose topic starts with this are kept (the live subscription's prefix).
    pub topic: Vec<u8>,
}

/// Why a replay request failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("replay socket: {0}")]
    Socket(#[from] ZmtpError),
    #[error(
        "replay answer with {0} frames after the delimiter, expected [topic, seq, payload] or [seq, payload]"
    )]
    Frames(usize),
    #[error("replay answer with a bad sequence frame")]
    Seq,
    #[error("replay answer over {0} bytes")]
    TooLarge(usize),
    #[error("replay timed out after {0:?}")]
    Timeout(Duration),
}

impl ReplayError {
    /// Over the answer's byte budget or a frame cap.
    pub fn is_oversized(&self) -> bool {
        matches!(self, ReplayError::TooLarge(_) | ReplayError::Socket(ZmtpError::Oversized(_)))
    }
}

/// One message of a replay answer.
#[derive(Debug, PartialEq, Eq)]
pub enum ReplayFrame {
    Message { topic: Bytes, seq: u64, payload: Bytes },
    End,
}

/// Reads one replay answer message (its frames as received, delimiter included or not).
pub fn parse_frames(frames: &[Bytes]) -> Result<ReplayFrame, ReplayError> {
    // Strip the REQ envelope's empty delimiter.
    let f = match frames.first() {
        Some(d) if d.is_empty() => &frames[1..],
        _ => frames,
    };
    let (topic, seq, payload) = match f {
        [topic, seq, payload] => (topic.clone(), seq, payload.clone()),
        [seq, payload] => (Bytes::new(), seq, payload.clone()),
        _ => return Err(ReplayError::Frames(f.len())),
    };
    if seq.as_ref() == END_SEQ {
        return Ok(ReplayFrame::End);
    }
    let seq = wire::decode_seq(seq).map_err(|_| ReplayError::Seq)?;
    Ok(ReplayFrame::Message { topic, seq, payload })
}

/// Requests messages from `start` over the engine's replay socket; reads until the end marker.
pub async fn request_replay(
    endpoint: &str,
    start: u64,
    limits: &ReplayLimits,
) -> Result<Replayed, ReplayError> {
    let endpoint: Endpoint = endpoint.parse()?;
    match tokio::time::timeout(limits.timeout, replay(&endpoint, start, limits)).await {
        Ok(r) => r,
        Err(_) => Err(ReplayError::Timeout(limits.timeout)),
    }
}

async fn replay(endpoint: &Endpoint, start: u64, limits: &ReplayLimits) -> Result<Replayed, ReplayError> {
    let mut opts = zmtp::Options::new(limits.max_frame_bytes);
    // One request, bounded by `limits.timeout` as a whole: no heartbeats.
    (opts.heartbeat, opts.timeout) = (None, limits.timeout);
    let per_message = opts.limits.max_message;
    let mut conn = zmtp::connect(endpoint, SocketType::Dealer, &opts).await?;
    conn.send(&[b"", &start.to_be_bytes()]).await?;
    let (mut out, mut left) = (Vec::new(), limits.max_bytes);
    loop {
        // The next message may declare what is left of the budget, no more.
        conn.set_limits(zmtp::Limits { max_message: per_message.min(left), ..opts.limits });
        let frames = match conn.recv().await {
            Err(ZmtpError::Oversized(o)) if o.what == "message bytes" && left < per_message => {
                return Err(ReplayError::TooLarge(limits.max_bytes))
            }
            r => r?,
        };
        left = left.saturating_sub(frames.iter().map(Bytes::len).sum());
        match parse_frames(&frames)? {
            ReplayFrame::End => return Ok(out),
            ReplayFrame::Message { topic, seq, payload } => {
                if topic.starts_with(&limits.topic) {
                    out.push((seq, payload));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(x: &[u8]) -> Bytes {
        Bytes::copy_from_slice(x)
    }

    /// What vLLM 0.34's and SGLang 0.5.23's `_service_replay` send (seen by a DEALER: the
    /// delimiter, then topic, seq, payload), and the two-frame form of older publishers.
    #[test]
    fn both_answer_shapes_and_the_end_marker() {
        let seq = 7u64.to_be_bytes();
        let real = [b(b""), b(b"kv"), b(&seq), b(b"payload")];
        assert_eq!(
            parse_frames(&real).unwrap(),
            ReplayFrame::Message { topic: b(b"kv"), seq: 7, payload: b(b"payload") }
        );
        let old = [b(b""), b(&seq), b(b"payload")];
        assert_eq!(
            parse_frames(&old).unwrap(),
            ReplayFrame::Message { topic: Bytes::new(), seq: 7, payload: b(b"payload") }
        );
        let end = [b(b""), b(b""), b(&END_SEQ), b(b"")];
        assert_eq!(parse_frames(&end).unwrap(), ReplayFrame::End);
        assert_eq!(parse_frames(&[b(b""), b(&END_SEQ), b(b"")]).unwrap(), ReplayFrame::End);
        assert!(matches!(parse_frames(&[b(b""), b(b"x")]), Err(ReplayError::Frames(1))));
        assert!(matches!(parse_frames(&[b(b""), b(b"t"), b(b"short"), b(b"p")]), Err(ReplayError::Seq)));
    }
}

//! Many queries over one long-lived `MatchStream` per replica.
//!
//! A [`StreamMux`] opens its stream on first use and keeps it. Every query gets a fresh
//! `request_id` and asks for the multiplexed contract (`in_band_errors`, `unordered`), so one
//! query's failure or token wait affects no other; a reader task routes each answer to its
//! caller by `request_id`. A query whose deadline passes returns [`MuxError::Timeout`] and
//! forgets its id, so its late answer is dropped, and the stream stays open. If the stream
//! breaks, every pending query gets the retriable [`MuxError::Broken`], and the next query
//! opens a new stream (the channel underneath reconnects on its own; an open that fails on a
//! connection the channel has not yet seen die is tried twice more).

use parking_lot::Mutex;
use prefixlog_proto::v1::{prefix_index_client::PrefixIndexClient, MatchError, MatchRequest, MatchResponse};
use prost::Message;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

/// Requests queued for the stream before a caller waits to send (each still bounded by its
/// own deadline); the server reads them as its per-stream in-flight limit allows. Each one's
/// `timeout_us` is set when it leaves the queue (see [`stamped`]).
const QUEUE: usize = 1024;

/// The pauses before opening a stream again after an open failed as broken: a replica that is
/// really gone costs a caller 11 ms more (it has its own deadline and other replicas).
const OPEN_RETRY_PAUSES: [std::time::Duration; 2] =
    [std::time::Duration::from_millis(1), std::time::Duration::from_millis(10)];

/// The largest request a replica decodes by default (its `max_decoding_message_size`, 4 MiB).
/// A larger one would end the whole stream with RESOURCE_EXHAUSTED, failing every other
/// pending query, so it is refused here, for that query alone.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

/// Room for the fields [`StreamMux::ask`] sets (id, flags, timeout) after the size check.
const SET_FIELDS_BYTES: usize = 32;

/// Why a multiplexed query has no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    /// The query's deadline passed; the stream stays open and a late answer is dropped.
    #[error("no answer within the query's deadline")]
    Timeout,
    /// The stream broke (replica gone, connection lost) while the query was pending, or could
    /// not be opened. Retriable: the next query opens a new stream.
    #[error("the query stream broke: {0}")]
    Broken(String),
    /// The replica refused the stream or answered this query with an error (in band).
    #[error("the replica answered {code:?}: {message}")]
    Status { code: Code, message: String },
    /// The request is larger than a replica accepts; not sent. Not retriable: every replica
    /// would refuse it.
    #[error("the request is {bytes} bytes, over the {limit}-byte limit")]
    TooLarge { bytes: usize, limit: usize },
}

impl MuxError {
    /// Worth retrying, here or on another replica.
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Broken(_) => true,
            Self::Timeout | Self::TooLarge { .. } => false,
            Self::Status { code, .. } => matches!(code, Code::Unavailable | Code::ResourceExhausted),
        }
    }

    /// [`MuxError::TooLarge`] if `req` (with the fields `ask` sets) is over [`MAX_REQUEST_BYTES`].
    pub fn check_size(req: &MatchRequest) -> Result<(), Self> {
        let bytes = req.encoded_len() + SET_FIELDS_BYTES;
        match bytes > MAX_REQUEST_BYTES {
            true => Err(Self::TooLarge { bytes, limit: MAX_REQUEST_BYTES }),
            false => Ok(()),
        }
    }

    /// An in-band error. Its code is never OK (a replica bug or a corrupted answer): UNKNOWN.
    fn in_band(e: MatchError) -> Self {
        let code = match Code::from(e.code as i32) {
            Code::Ok => Code::Unknown,
            code => code,
        };
        Self::Status { code, message: e.message }
    }

    fn status(s: &tonic::Status) -> Self {
        match s.code() {
            Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled => {
                Self::Broken(format!("{:?}: {}", s.code(), s.message()))
            }
            code => Self::Status { code, message: s.message().to_string() },
        }
    }
}

type Reply = oneshot::Sender<Result<MatchResponse, MuxError>>;

/// The callers waiting on one stream, and why it broke once it has.
#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, Reply>,
    broken: Option<String>,
}

/// One open stream. Dropping it (the last query's handle and the mux's slot) closes the
/// request side, so the server finishes and the reader task ends.
struct Conn {
    /// Each request with its caller's deadline.
    tx: mpsc::Sender<(MatchRequest, Instant)>,
    pending: Arc<Mutex<Pending>>,
}

/// The multiplexer of one replica. Cheap to share behind an `Arc`; the stream opens lazily.
pub struct StreamMux {
    client: PrefixIndexClient<Channel>,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    next_id: AtomicU64,
    opened: AtomicU64,
    in_flight: AtomicUsize,
}

impl StreamMux {
    pub fn new(channel: Channel) -> Self {
        Self {
            client: PrefixIndexClient::new(channel),
            conn: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
            opened: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Streams opened so far (1 while the first one lasts).
    pub fn streams_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Queries waiting for their answer now, counted once queued on the stream (so a caller
    /// that sees one counted and then asks is queued behind it).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Asks `req` (its `request_id`, stream flags and `timeout_us` are set here) and waits for
    /// its answer until `end`.
    pub async fn ask(&self, mut req: MatchRequest, end: Instant) -> Result<MatchResponse, MuxError> {
        MuxError::check_size(&req)?;
        let conn = tokio::time::timeout_at(end, self.connection()).await.map_err(|_| MuxError::Timeout)??;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        (req.request_id, req.in_band_errors, req.unordered) = (id, true, true);
        let (reply, answer) = oneshot::channel();
        let _forget = {
            let mut p = conn.pending.lock();
            if let Some(why) = &p.broken {
                return Err(MuxError::Broken(why.clone()));
            }
            p.waiting.insert(id, reply);
            // Whatever ends this call (answer, deadline, the caller dropping it) forgets the id.
            Forget { pending: &conn.pending, id }
        };
        let sent = tokio::time::timeout_at(end, conn.tx.send((req, end))).await;
        match sent {
            Err(_) => return Err(MuxError::Timeout),
            Ok(Err(_)) => return Err(self.broken(&conn, "the request side is closed")),
            Ok(Ok(())) => {}
        }
        // Counted once queued: a query counted is ahead of every query sent after the count.
        self.in_flight.fetch_add(1, Ordering::Release);
        let _counted = Counted(&self.in_flight);
        match tokio::time::timeout_at(end, answer).await {
            Err(_) => Err(MuxError::Timeout),
            Ok(Err(_)) => Err(self.broken(&conn, "the reader stopped")),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Ok(Ok(resp))) => match resp.error {
                Some(e) => Err(MuxError::in_band(e)),
                None => Ok(resp),
            },
        }
    }

    /// The open stream, or a new one.
    async fn connection(&self) -> Result<Arc<Conn>, MuxError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| c.pending.lock().broken.is_none()) {
            return Ok(c.clone());
        }
        *slot = None;
        // Opening sends no query, so it is safe to try again: a connection that died under the
        // channel (a replica restarted) fails the calls made on it until the channel notices
        // and connects anew.
        let mut pauses = OPEN_RETRY_PAUSES.iter();
        let conn = loop {
            match (self.open().await, pauses.next()) {
                (Err(MuxError::Broken(_)), Some(&pause)) => tokio::time::sleep(pause).await,
                (opened, _) => break opened?,
            }
        };
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// A new stream and the task that routes its answers.
    async fn open(&self) -> Result<Arc<Conn>, MuxError> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let mut client = self.client.clone();
        let inbound = client
            .match_stream(
                tokio_stream::wrappers::ReceiverStream::new(rx)
                    .filter_map(|(req, end)| stamped(req, end, Instant::now())),
            )
            .await
            .map_err(|s| MuxError::status(&s))?
            .into_inner();
        self.opened.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn { tx, pending: Arc::default() });
        tokio::spawn(route(inbound, conn.pending.clone()));
        Ok(conn)
    }

    /// Marks `conn` broken (if the reader has not yet) so the next query opens a new stream.
    fn broken(&self, conn: &Conn, why: &str) -> MuxError {
        let mut p = conn.pending.lock();
        MuxError::Broken(p.broken.get_or_insert_with(|| why.to_string()).clone())
    }
}

/// `req` as it is written to the stream, with what is left of its caller's deadline as its
/// `timeout_us` (the replica ends a token wait a margin before it, as for a unary call's
/// deadline), or `None` if the caller has given up: a query queued behind many others does not
/// get its full budget on the replica after its caller is gone.
fn stamped(mut req: MatchRequest, end: Instant, now: Instant) -> Option<MatchRequest> {
    let left = end.checked_duration_since(now).filter(|d| !d.is_zero())?;
    req.timeout_us = left.as_micros().max(1) as u64;
    Some(req)
}

/// Removes a query's id from the pending map when its call ends.
struct Forget<'a> {
    pending: &'a Mutex<Pending>,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.pending.lock().waiting.remove(&self.id);
    }
}

/// One query in [`StreamMux::in_flight`] until dropped.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Routes answers to their callers until the stream ends; then fails every pending query.
async fn route(mut inbound: Streaming<MatchResponse>, pending: Arc<Mutex<Pending>>) {
    let why = loop {
        match inbound.message().await {
            Ok(Some(resp)) => {
                // No caller: its deadline passed, the answer is late. Dropped.
                if let Some(reply) = pending.lock().waiting.remove(&resp.request_id) {
                    let _ = reply.send(Ok(resp));
                }
            }
            Ok(None) => break "the replica ended the stream".to_string(),
            Err(s) => break format!("{:?}: {}", s.code(), s.message()),
        }
    };
    let mut p = pending.lock();
    let why = p.broken.get_or_insert(why).clone();
    for (_, reply) in p.waiting.drain() {
        let _ = reply.send(Err(MuxError::Broken(why.clone())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(tokens: usize) -> MatchRequest {
        let ids = vec![u32::MAX; tokens];
        let prompt = prefixlog_proto::v1::match_request::Prompt::Tokens(prefixlog_proto::v1::TokenIds {
            ids,
            ..Default::default()
        });
        MatchRequest { prompt: Some(prompt), ..Default::default() }
    }

    #[test]
    fn an_oversized_request_is_refused_alone_and_not_retried() {
        assert_eq!(MuxError::check_size(&request(1000)), Ok(()));
        let e = MuxError::check_size(&request(1 << 20)).unwrap_err();
        assert!(matches!(e, MuxError::TooLarge { bytes, limit } if bytes > limit), "{e:?}");
        assert!(!e.is_retriable());
    }

    #[test]
    fn the_timeout_is_what_is_left_when_written_and_expired_requests_are_dropped() {
        let now = Instant::now();
        let end = now + std::time::Duration::from_millis(50);
        let late = now + std::time::Duration::from_millis(30);
        assert_eq!(stamped(request(1), end, late).map(|r| r.timeout_us), Some(20_000));
        assert_eq!(stamped(request(1), end, end), None);
        assert_eq!(stamped(request(1), end, end + std::time::Duration::from_millis(1)), None);
    }

    #[test]
    fn an_in_band_error_is_never_ok() {
        let e = |code| MuxError::in_band(MatchError { code, message: "m".into() });
        assert_eq!(e(0), MuxError::Status { code: Code::Unknown, message: "m".into() });
        assert_eq!(e(3), MuxError::Status { code: Code::InvalidArgument, message: "m".into() });
    }

    #[tokio::test]
    async fn ask_refuses_an_oversized_request_before_opening_a_stream() {
        // Nothing listens there: a request that got past the check would fail another way.
        let channel = Channel::from_static("http://127.0.0.1:9").connect_lazy();
        let mux = StreamMux::new(channel);
        let end = Instant::now() + std::time::Duration::from_secs(5);
        let e = mux.ask(request(1 << 20), end).await.unwrap_err();
        assert!(matches!(e, MuxError::TooLarge { .. }), "{e:?}");
        assert_eq!(mux.streams_opened(), 0);
    }
}

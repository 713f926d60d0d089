//! `MatchStream`: many queries over one bidirectional stream, a bounded number of them worked
//! on at once.
//!
//! The stream's task reads requests while fewer than `max_in_flight_per_stream` are admitted
//! and not yet sent, answers them concurrently on that one task (no task per query: the point
//! of the stream is a lower cost per query than unary calls), and sends each answer when
//! [`Order`] allows it. Two per-request opt-ins (both additive, see `query.proto`):
//! - `in_band_errors`: a failure becomes an answer carrying `error`; otherwise the failure is
//!   sent as the stream's status and ends it (the original contract).
//! - `unordered`: the answer is sent as soon as it is ready. Otherwise it waits until every
//!   earlier request of the stream has been answered (the original request order), so a
//!   request waiting for its consistency token holds up the answers behind it, not their work.

use crate::error::QueryError;
use crate::service::QueryService;
use futures_util::stream::FuturesUnordered;
use prefixlog_proto::v1::{MatchError, MatchRequest, MatchResponse};
use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::Sender;
use tokio::sync::OwnedSemaphorePermit;
use tokio_stream::{Stream, StreamExt};
use tonic::{Status, Streaming};

/// What the server sends: answers, and at most one status that ends the stream.
pub type MatchStream = Pin<Box<dyn Stream<Item = Result<MatchResponse, Status>> + Send>>;
type Out = Result<MatchResponse, Status>;

/// Serves one `MatchStream` call on a task of its own. `timeout` is the call's `grpc-timeout`:
/// it bounds every request's consistency-token wait, less what has elapsed since `opened`, as
/// does a request's own `timeout_us` (the one bound a multiplexing client can give per query).
pub(crate) fn serve(
    svc: QueryService,
    inbound: Streaming<MatchRequest>,
    opened: Instant,
    timeout: Option<Duration>,
    permit: OwnedSemaphorePermit,
) -> MatchStream {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let _permit = permit;
        run(&svc, inbound, opened, timeout, tx).await;
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// One admitted request, answered.
struct Done {
    seq: u64,
    ordered: bool,
    out: Out,
}

async fn run(
    svc: &QueryService,
    mut inbound: Streaming<MatchRequest>,
    opened: Instant,
    timeout: Option<Duration>,
    tx: Sender<Out>,
) {
    let limit = svc.config().max_in_flight_per_stream.max(1);
    let mut running = FuturesUnordered::new();
    let mut order = Order::default();
    let mut reading = true;
    loop {
        let admit = reading && running.len() + order.held() < limit;
        tokio::select! {
            // Answers first: sending frees room for the next request.
            biased;
            Some(done) = running.next(), if !running.is_empty() => {
                for out in order.complete(done) {
                    let ends = out.is_err();
                    if tx.send(out).await.is_err() || ends {
                        return;
                    }
                }
            }
            next = inbound.next(), if admit => {
                let Some(item) = next else {
                    reading = false;
                    continue;
                };
                // A message that could not be decoded has no request to answer: its status
                // ends the stream, in its turn (after the answers admitted before it).
                reading = item.is_ok();
                let own = item.as_ref().ok().filter(|r| r.timeout_us > 0).map(|r| Duration::from_micros(r.timeout_us));
                let stream = timeout.map(|t| t.saturating_sub(opened.elapsed()));
                let wait = svc.wait_budget([own, stream].into_iter().flatten().min());
                running.push(work(svc, item, order.admit(), wait));
            }
            else => return,
        }
        if !reading && running.is_empty() {
            return;
        }
    }
}

/// Answers one request (or turns a decode failure into its status), in-band if asked.
async fn work(svc: &QueryService, item: Result<MatchRequest, Status>, seq: u64, wait: Duration) -> Done {
    let req = match item {
        Ok(req) => req,
        // Same contract as unary calls (see `server::oversize_is_resource_exhausted`).
        Err(s) if s.code() == tonic::Code::OutOfRange => {
            return Done {
                seq,
                ordered: true,
                out: Err(QueryError::ResourceExhausted(s.message().into()).into()),
            }
        }
        Err(s) => return Done { seq, ordered: true, out: Err(s) },
    };
    let (ordered, in_band, request_id) = (!req.unordered, req.in_band_errors, req.request_id);
    let out = match svc.answer(req, wait).await {
        Err(s) if in_band => Ok(error_answer(&s, request_id, svc.replica_id())),
        r => r,
    };
    Done { seq, ordered, out }
}

/// The in-band answer of a failed query: its status, the echo and who answered.
pub fn error_answer(s: &Status, request_id: u64, replica_id: &str) -> MatchResponse {
    MatchResponse {
        request_id,
        replica_id: replica_id.to_string(),
        error: Some(MatchError { code: s.code() as u32, message: s.message().to_string() }),
        ..Default::default()
    }
}

/// When answers may be sent. Requests are numbered in arrival order; an ordered request's
/// answer is sent once every earlier request's answer has been sent, an unordered one's at
/// once. Only the admitted-but-unsent requests are tracked (not the ones sent ahead of a slow
/// one), so everything here is bounded by the in-flight limit however long one query waits.
#[derive(Default)]
struct Order {
    next_seq: u64,
    /// Admitted and not yet sent (running or held); its minimum is the lowest unsent.
    unsent: BTreeSet<u64>,
    /// Ordered answers ready but not yet allowed.
    held: BTreeMap<u64, Out>,
}

impl Order {
    fn admit(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.unsent.insert(seq);
        seq
    }

    fn held(&self) -> usize {
        self.held.len()
    }

    /// `done` is ready: the answers to send now, in order.
    fn complete(&mut self, done: Done) -> Vec<Out> {
        if done.ordered && self.unsent.first() != Some(&done.seq) {
            self.held.insert(done.seq, done.out);
            return Vec::new();
        }
        self.unsent.remove(&done.seq);
        let mut send = vec![done.out];
        while let Some(out) = self.unsent.first().and_then(|low| self.held.remove(low)) {
            self.unsent.pop_first();
            send.push(out);
        }
        send
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(seq: u64, ordered: bool) -> Done {
        Done { seq, ordered, out: Ok(MatchResponse { request_id: seq, ..Default::default() }) }
    }

    fn ids(v: Vec<Out>) -> Vec<u64> {
        v.into_iter().map(|o| o.unwrap().request_id).collect()
    }

    #[test]
    fn ordered_answers_wait_for_every_earlier_one() {
        let mut o = Order::default();
        for _ in 0..4 {
            o.admit();
        }
        assert!(ids(o.complete(done(2, true))).is_empty());
        assert!(ids(o.complete(done(1, true))).is_empty());
        assert_eq!(o.held(), 2);
        assert_eq!(ids(o.complete(done(0, true))), vec![0, 1, 2]);
        assert_eq!(ids(o.complete(done(3, true))), vec![3]);
        assert_eq!(o.held(), 0);
    }

    #[test]
    fn unordered_answers_go_at_once_and_release_what_waited_for_them() {
        let mut o = Order::default();
        for _ in 0..4 {
            o.admit();
        }
        assert_eq!(ids(o.complete(done(2, false))), vec![2]);
        assert!(ids(o.complete(done(1, true))).is_empty());
        assert_eq!(ids(o.complete(done(3, false))), vec![3]);
        // 0 goes, then 1 (held), 2 and 3 were sent ahead.
        assert_eq!(ids(o.complete(done(0, false))), vec![0, 1]);
        assert_eq!((o.unsent.len(), o.held()), (0, 0));
    }

    #[test]
    fn a_slow_query_does_not_make_the_unordered_ones_behind_it_pile_up() {
        let mut o = Order::default();
        let slow = o.admit();
        for _ in 0..1000 {
            let seq = o.admit();
            assert_eq!(ids(o.complete(done(seq, false))), vec![seq]);
        }
        // Only the slow one is tracked, not the 1000 answers sent ahead of it.
        assert_eq!((o.unsent.len(), o.held()), (1, 0));
        let held = o.admit();
        assert!(ids(o.complete(done(held, true))).is_empty());
        assert_eq!(ids(o.complete(done(slow, true))), vec![slow, held]);
        assert_eq!((o.unsent.len(), o.held()), (0, 0));
    }
}

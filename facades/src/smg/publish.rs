//! The `Publish` stream: updates in, one `PublishAck` per update out, in order.
//!
//! Updates of different holders are written concurrently (a gateway's placements name many
//! workers), at most [`MAX_UPDATES_IN_FLIGHT`] per stream; updates of one holder are applied in
//! stream order (each takes the holder's lock, in turn, before the next update is read: the
//! epoch and sequence gate needs the previous update's outcome); the lock is queued for before
//! the next update is read, and awaited by the update's own task, so a busy holder does not stop
//! the stream being read (h2 closes a connection whose small frames wait unread past its
//! budget). An ack is sent once the log
//! took the update's records and this replica applied them (bounded by the query port's
//! default wait; past it the ack goes out anyway: the log has the records), so a query sent
//! after the ack sees the update. Acks are advisory upstream: when the publisher does not read
//! them they are dropped (counted, reason `ack_dropped`), never holding up the updates behind
//! them. A refused update ends the stream with its status, as upstream ends it on an
//! unsupported hash scheme; updates read before it may still be applied. An update naming a
//! holder outside the writer's token names ([`crate::writers`]) is refused so, with
//! PERMISSION_DENIED (counted, reason `writer_not_allowed`), before anything of it is written.

use super::pb::{PublishAck, Update};
use super::update;
use super::writer::{Locked, WriteError, Writer, Written};
use super::OUT_BUFFER;
use crate::metrics::FacadeMetrics;
use crate::writers::Grant;
use futures_util::stream::FuturesOrdered;
use prefixlog_state::token_of;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::Sender;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;
use tokio_stream::{Stream, StreamExt};
use tonic::{Status, Streaming};

/// Updates of one stream being written at once.
pub const MAX_UPDATES_IN_FLIGHT: usize = 256;

/// What the server sends: acks, and at most one status that ends the stream.
pub type AckStream = Pin<Box<dyn Stream<Item = Result<PublishAck, Status>> + Send>>;

/// Serves one `Publish` call on a task of its own.
/// `place` (one of the facade's stream places) is held until the stream ends.
pub fn serve(
    writer: Arc<Writer>,
    metrics: FacadeMetrics,
    grant: Grant,
    inbound: Streaming<Update>,
    place: OwnedSemaphorePermit,
) -> AckStream {
    let (tx, rx) = tokio::sync::mpsc::channel(OUT_BUFFER);
    tokio::spawn(async move {
        let _place = place;
        let code = match run(&writer, &metrics, &grant, inbound, &tx).await {
            Ok(()) => tonic::Code::Ok,
            Err(s) => {
                let code = s.code();
                // The end of the stream: waits for room (the reader may be slow, not gone).
                let _ = tx.send(Err(s)).await;
                code
            }
        };
        metrics.request("Publish", code);
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

type Running = FuturesOrdered<JoinHandle<Result<PublishAck, Status>>>;

async fn run(
    writer: &Arc<Writer>,
    metrics: &FacadeMetrics,
    grant: &Grant,
    mut inbound: Streaming<Update>,
    tx: &Sender<Result<PublishAck, Status>>,
) -> Result<(), Status> {
    let wait = writer.query().wait_for_call(None);
    let mut running: Running = FuturesOrdered::new();
    let mut reading = true;
    while reading || !running.is_empty() {
        tokio::select! {
            // Acks first: sending frees room for the next update.
            biased;
            Some(done) = running.next(), if !running.is_empty() => {
                let ack = done.map_err(|e| Status::internal(format!("publish task: {e}")))??;
                match tx.try_send(Ok(ack)) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => metrics.skipped("ack_dropped", 1),
                    Err(TrySendError::Closed(_)) => return Ok(()),
                }
            }
            next = inbound.next(), if reading && running.len() < MAX_UPDATES_IN_FLIGHT => {
                let Some(u) = next else {
                    reading = false;
                    continue;
                };
                let u = u.map_err(super::inbound_status)?;
                let ks = update::validate(&u).map_err(|e| refused(metrics, e.into()))?;
                let (worker, lock) = admit(grant, metrics, writer, &u, &ks)?;
                let guard = queued(lock).await;
                let (writer, metrics, grant) = (writer.clone(), metrics.clone(), grant.clone());
                running.push_back(tokio::spawn(async move {
                    let guard = guard.await;
                    write(&writer, &metrics, &grant, u, worker, guard, wait).await
                }));
            }
        }
    }
    Ok(())
}

/// `lock` polled once, so that it has its place in the holder's queue (tokio's mutex is fair:
/// places are kept in the order they were first polled); the rest of the wait, to be awaited
/// elsewhere.
async fn queued(lock: impl Future<Output = Locked> + Send + 'static) -> impl Future<Output = Locked> + Send {
    let mut lock = Box::pin(lock);
    let first = std::future::poll_fn(|cx| Poll::Ready(lock.as_mut().poll(cx))).await;
    async move {
        match first {
            Poll::Ready(guard) => guard,
            Poll::Pending => lock.await,
        }
    }
}

/// Checks the update's holder against the writer's names and quota (a drop alone gives the
/// holder's place back); the holder's id and lock.
fn admit(
    grant: &Grant,
    metrics: &FacadeMetrics,
    writer: &Writer,
    u: &Update,
    ks: &prefixlog_engine::KeyspaceId,
) -> Result<(u64, impl std::future::Future<Output = Locked> + Send + 'static), Status> {
    let denied = |e: crate::writers::WriterDenied| {
        metrics.skipped(e.reason(), 1);
        metrics.writer_refused(grant.label(), e.reason());
        e.status()
    };
    grant.check(&u.holder).map_err(denied)?;
    let (worker, lock) = writer.lock(&u.holder).map_err(|e| e.status())?;
    if u.dropped && u.events.is_empty() && u.added.is_none() {
        grant.release(worker);
    } else {
        grant.admit(worker, ks).map_err(denied)?;
    }
    Ok((worker, lock))
}

/// One update, written and applied here (bounded by `wait`); its ack.
async fn write(
    writer: &Writer,
    metrics: &FacadeMetrics,
    grant: &Grant,
    u: Update,
    worker: u64,
    guard: Locked,
    wait: Duration,
) -> Result<PublishAck, Status> {
    let w = writer.write_locked(&u, worker, guard, wait).await.map_err(|e| {
        if let WriteError::SharedLimit(limit) = &e {
            metrics.skipped(limit.reason(), 1);
            metrics.writer_refused(grant.label(), limit.reason());
        }
        refused(metrics, e)
    })?;
    count(metrics, &w);
    let status = &writer.query().view().status;
    if !w.landed.is_empty() && !status.wait_for(&token_of(&w.landed), wait).await {
        tracing::debug!(holder = %u.holder, ?wait, "update on the log, not applied here within the wait");
    }
    Ok(w.ack)
}

fn refused(metrics: &FacadeMetrics, e: WriteError) -> Status {
    match &e {
        WriteError::Refused(r) => r.reason().into_iter().for_each(|why| metrics.skipped(why, 1)),
        WriteError::EpochJump { .. } => metrics.skipped("epoch_jump", 1),
        WriteError::Update(update::UpdateError::BadName(_)) => metrics.skipped("bad_name", 1),
        _ => {}
    }
    e.status()
}

fn count(metrics: &FacadeMetrics, w: &Written) {
    for (reason, n) in w.skipped.reasons() {
        metrics.skipped(reason, n);
    }
    metrics.skipped("stale_epoch", u64::from(w.stale_epoch));
    metrics.skipped("duplicate_seq", u64::from(w.duplicate));
    metrics.skipped("placement_for_event_fed", w.fed_placements);
}

//! The engine stream's subscription: a reader task per connection ([`read_stream`]: the
//! [`zmtp`] SUB client, which answers heartbeats while the stream is busy) hands whole messages
//! to [`EngineBridge::subscribe_loop`], which handles them in order and reconnects, with
//! back-off, whenever the connection ends.
//!
//! Bounded: a message is at most the frame cap plus [`zmtp::codec::MESSAGE_ROOM`]
//! (`--max-frame-bytes`), and the messages read but not yet handled hold at most
//! [`queue_bytes`] (twice a message's cap); past it the reader stops reading, the engine's
//! socket queues and, at its high-water mark, drops (a gap the stream recovers). A connection
//! that ends (a peer over a cap, one that breaks the protocol or stops answering heartbeats, a
//! closed socket) is counted by why ([`BridgeMetrics::disconnected`]); messages lost meanwhile
//! are a sequence gap, recovered as `fill_gap` says.

use crate::metrics::BridgeMetrics;
use crate::zmtp::{self, Endpoint, SocketType, ZmtpError};
use crate::EngineBridge;
use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

/// "No timeout" for `tokio::time::timeout` (a year).
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// What a reader task sends its stream.
enum Incoming {
    /// Connected and subscribed.
    Subscribed,
    /// A message, holding its share of the queue's byte budget until it is handled.
    Message(Vec<Bytes>, OwnedSemaphorePermit),
}

/// The byte budget of the messages read and not yet handled, in KiB (a semaphore's permits):
/// two messages at the cap.
pub fn queue_bytes(limits: &zmtp::Limits) -> usize {
    limits.max_message.saturating_mul(2)
}

/// The KiB a message of `bytes` takes of the queue's budget.
fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX)
}

/// Connects, subscribes to `topic` and forwards every message whose first frame starts with it
/// (the publisher filters too; this is the SUB's own check), until the connection fails or the
/// stream stops listening (`Ok`).
async fn read_stream(
    endpoint: Endpoint,
    topic: Vec<u8>,
    opts: zmtp::Options,
    tx: mpsc::Sender<Incoming>,
    budget: Arc<Semaphore>,
) -> Result<(), ZmtpError> {
    let mut conn = zmtp::connect(&endpoint, SocketType::Sub, &opts).await?;
    conn.subscribe(&topic).await?;
    if tx.send(Incoming::Subscribed).await.is_err() {
        return Ok(());
    }
    loop {
        let frames = conn.recv().await?;
        if !frames.first().is_some_and(|t| t.starts_with(&topic)) {
            continue;
        }
        let size: usize = frames.iter().map(Bytes::len).sum();
        let Ok(permit) = budget.clone().acquire_many_owned(kib(size)).await else { return Ok(()) };
        if tx.send(Incoming::Message(frames, permit)).await.is_err() {
            return Ok(());
        }
    }
}

impl EngineBridge {
    /// The connection options of this stream's subscription.
    fn zmtp_options(&self) -> zmtp::Options {
        let mut o = zmtp::Options::new(self.opts.max_frame_bytes);
        o.heartbeat = Some(self.opts.heartbeat_interval).filter(|d| !d.is_zero());
        o.timeout = self.opts.heartbeat_timeout;
        o
    }

    /// Subscribes and handles messages until `stop` turns true: re-subscribes after a failed
    /// connection (backing off 0.2 s, 0.4 s, … up to 6.4 s while failures repeat without a
    /// message between them) and after `idle_reconnect` without a message; `tail_probe` after
    /// the last message, asks the replay socket whether anything followed it
    /// ([`EngineBridge::probe_tail`]).
    pub(crate) async fn subscribe_loop(&mut self, mut stop: watch::Receiver<bool>) -> anyhow::Result<()> {
        let endpoint: Endpoint = self.spec.endpoint.parse()?;
        let opts = self.zmtp_options();
        let budget = Arc::new(Semaphore::new(kib(queue_bytes(&opts.limits)) as usize));
        let mut last_log = Instant::now();
        let mut first_connect = true;
        let mut failures: u32 = 0;
        loop {
            let (tx, mut rx) = mpsc::channel::<Incoming>(1024);
            let reader = tokio::spawn(read_stream(
                endpoint.clone(),
                self.spec.topic.clone().into_bytes(),
                opts,
                tx,
                budget.clone(),
            ));
            let abort = reader.abort_handle();
            if first_connect {
                tracing::info!(endpoint = %self.spec.endpoint, worker = self.spec.worker, "bridge: subscribing");
                first_connect = false;
            } else {
                tracing::debug!(endpoint = %self.spec.endpoint, worker = self.spec.worker, "bridge: re-subscribing");
                self.resubscribed = true;
            }
            let mut connected = false;
            // The engine's last messages may be the ones lost (a full send queue drops them and
            // nothing after them tells): once quiet, the replay socket is asked what came after.
            let mut tail_checked = false;
            let ended = loop {
                if !self.opts.log_interval.is_zero() && last_log.elapsed() >= self.opts.log_interval {
                    last_log = Instant::now();
                    self.log_metrics();
                }
                // Idle only counts once connected: connecting is bounded on its own.
                let probe_tail = connected && !tail_checked && self.can_probe_tail();
                let idle = match (connected, probe_tail) {
                    (false, _) => FOREVER,
                    (true, true) => self.opts.tail_probe.min(self.opts.idle_reconnect),
                    (true, false) => self.opts.idle_reconnect,
                };
                tokio::select! {
                    _ = stop.changed() => {
                        abort.abort();
                        return Ok(());
                    }
                    r = tokio::time::timeout(idle, rx.recv()) => match r {
                        Ok(Some(Incoming::Subscribed)) => {
                            connected = true;
                            tracing::debug!(endpoint = %self.spec.endpoint, "bridge: subscribed");
                        }
                        Ok(Some(Incoming::Message(frames, permit))) => {
                            failures = 0;
                            tail_checked = false;
                            self.handle(frames).await;
                            drop(permit);
                        }
                        Ok(None) => break Some(reader.await),
                        Err(_) if probe_tail => {
                            tail_checked = true;
                            self.probe_tail().await;
                        }
                        Err(_) => break None,
                    }
                }
            };
            abort.abort();
            BridgeMetrics::inc(&self.metrics.reconnects);
            let Some(ended) = ended else {
                tracing::debug!(endpoint = %self.spec.endpoint, "bridge: idle, re-subscribing");
                continue;
            };
            let error = match ended {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(join) => {
                    tracing::error!(endpoint = %self.spec.endpoint, error = %join, "bridge: subscriber task failed");
                    None
                }
            };
            if let Some(e) = &error {
                self.metrics.disconnected(e.ending());
                if matches!(e, ZmtpError::Oversized(o) if o.is_message()) {
                    // What it carried is lost: a sequence gap the next message reveals.
                    BridgeMetrics::inc(&self.metrics.messages_oversized);
                }
            }
            let why = error.map_or_else(|| "ended".to_string(), |e| e.to_string());
            let wait = Duration::from_millis(200 << failures.min(5));
            failures += 1;
            if failures.is_power_of_two() {
                tracing::warn!(endpoint = %self.spec.endpoint, worker = self.spec.worker, error = %why, failures, "bridge: subscription ended, reconnecting");
            }
            tokio::select! {
                _ = stop.changed() => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

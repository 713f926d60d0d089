//! Serving `FetchCheckpoint` within bounds: at most [`ServeLimits::checkpoint_transfers`] at a
//! time (one more is answered RESOURCE_EXHAUSTED at once, and the caller tries another peer or
//! retries later), each streamed in 1 MiB messages through a channel of two, so a transfer holds
//! one stored chunk (4 MiB) and a few messages whatever the checkpoint's size. A receiver that
//! takes no message for [`ServeLimits::stall_timeout`] is dropped, freeing its slot: a stalled
//! or hostile caller cannot keep transfers, or their memory, forever.

use prefixlog_proto::v1 as pb;
use prefixlog_snapshot::{export_partitions, CheckpointStore, ExportSink, Streamed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// One message's data.
pub const MESSAGE_BYTES: usize = 1 << 20;
/// Messages queued for the network per transfer.
const IN_FLIGHT: usize = 2;

/// Bounds of the peer port's checkpoint transfers.
#[derive(Clone, Debug)]
pub struct ServeLimits {
    /// Transfers served at once.
    pub checkpoint_transfers: usize,
    /// A transfer whose receiver takes no message for this long is dropped.
    pub stall_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self { checkpoint_transfers: 2, stall_timeout: Duration::from_secs(60) }
    }
}

pub type Chunk = Result<pb::CheckpointChunk, Status>;

/// The transfer slots.
#[derive(Clone)]
pub struct Transfers {
    slots: Arc<Semaphore>,
    limits: ServeLimits,
}

impl Transfers {
    pub fn new(limits: ServeLimits) -> Self {
        Self { slots: Arc::new(Semaphore::new(limits.checkpoint_transfers)), limits }
    }

    /// A slot, or RESOURCE_EXHAUSTED.
    pub fn slot(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.slots.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "this replica is already serving {} checkpoint transfers (its limit, \
                 --peer-checkpoint-transfers): ask another replica or retry later",
                self.limits.checkpoint_transfers
            ))
        })
    }

    /// Streams the newest checkpoint's export (of `partitions`; empty: all) on a blocking
    /// thread, which holds `slot` until the stream ends.
    pub fn start(
        &self,
        slot: OwnedSemaphorePermit,
        store: Arc<CheckpointStore>,
        id: u64,
        partitions: Vec<u32>,
    ) -> mpsc::Receiver<Chunk> {
        let (tx, rx) = mpsc::channel(IN_FLIGHT);
        let mut sink = ChunkSink::new(tx, tokio::runtime::Handle::current(), self.limits.stall_timeout);
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let covered = store.meta(id).map(|m| m.identity.owned).unwrap_or_default();
            let whole = partitions.is_empty() || partitions == covered;
            let streamed = if whole {
                store.export_to(id, &mut sink).map_err(|e| Status::internal(format!("checkpoint {id}: {e}")))
            } else {
                // A partition-filtered export is built in memory (restore, extract, encode),
                // then streamed: bounded by the slot count, not by chunks.
                export_partitions(&store, id, &partitions)
                    .map_err(|e| Status::internal(format!("exporting checkpoint {id}: {e}")))
                    .map(|data| sink.feed(id, &data))
            };
            match streamed {
                Ok(Streamed::Complete { .. }) => sink.finish(),
                Ok(Streamed::Stopped) => {
                    tracing::info!(
                        checkpoint = id,
                        "checkpoint transfer ended early: the receiver left or stalled"
                    )
                }
                Err(status) => {
                    tracing::error!(checkpoint = id, error = %status.message(), "checkpoint transfer failed");
                    sink.fail(status);
                }
            }
        });
        rx
    }
}

/// Cuts an export into 1 MiB messages and sends each, the last one marked and carrying the
/// checksum of the whole.
struct ChunkSink {
    tx: mpsc::Sender<Chunk>,
    rt: tokio::runtime::Handle,
    stall: Duration,
    id: u64,
    total: u64,
    sent: u64,
    buf: Vec<u8>,
    whole: Xxh3,
}

impl ChunkSink {
    fn new(tx: mpsc::Sender<Chunk>, rt: tokio::runtime::Handle, stall: Duration) -> Self {
        Self {
            tx,
            rt,
            stall,
            id: 0,
            total: 0,
            sent: 0,
            buf: Vec::with_capacity(MESSAGE_BYTES),
            whole: Xxh3::new(),
        }
    }

    /// Sends one message, waiting at most the stall timeout for room. False: the receiver is
    /// gone or stalled.
    fn send(&self, m: Chunk) -> bool {
        matches!(self.rt.block_on(tokio::time::timeout(self.stall, self.tx.send(m))), Ok(Ok(())))
    }

    fn message(&mut self, data: Vec<u8>, last: bool) -> pb::CheckpointChunk {
        self.sent += data.len() as u64;
        pb::CheckpointChunk {
            checkpoint_id: self.id,
            total_bytes: self.total,
            chunk_checksum: xxh3_64(&data),
            data,
            last,
            total_checksum: if last { self.whole.digest() } else { 0 },
        }
    }

    /// A whole export held in memory.
    fn feed(&mut self, id: u64, data: &[u8]) -> Streamed {
        if !self.begin(id, data.len() as u64) {
            return Streamed::Stopped;
        }
        for piece in data.chunks(MESSAGE_BYTES) {
            if !self.write(piece) {
                return Streamed::Stopped;
            }
        }
        Streamed::Complete { bytes: data.len() as u64 }
    }

    /// The rest, as the last message.
    fn finish(mut self) {
        let rest = std::mem::take(&mut self.buf);
        if self.sent + rest.len() as u64 != self.total {
            let what =
                format!("export of {} bytes announced as {}", self.sent + rest.len() as u64, self.total);
            return self.fail(Status::internal(what));
        }
        let m = self.message(rest, true);
        self.send(Ok(m));
    }

    fn fail(self, status: Status) {
        self.send(Err(status));
    }
}

impl ExportSink for ChunkSink {
    fn begin(&mut self, checkpoint_id: u64, total_bytes: u64) -> bool {
        (self.id, self.total) = (checkpoint_id, total_bytes);
        true
    }

    /// A full message goes out once more data follows it, so the last one is never empty.
    fn write(&mut self, mut piece: &[u8]) -> bool {
        self.whole.update(piece);
        while !piece.is_empty() {
            if self.buf.len() == MESSAGE_BYTES {
                let data = std::mem::replace(&mut self.buf, Vec::with_capacity(MESSAGE_BYTES));
                let m = self.message(data, false);
                if !self.send(Ok(m)) {
                    return false;
                }
            }
            let n = (MESSAGE_BYTES - self.buf.len()).min(piece.len());
            self.buf.extend_from_slice(&piece[..n]);
            piece = &piece[n..];
        }
        true
    }
}

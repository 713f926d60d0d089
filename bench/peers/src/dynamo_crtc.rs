//! `dynamo-kv-router = "=1.6.1"`: `ConcurrentRadixTreeCompressed` behind `ThreadPoolIndexer`
//! (Dynamo's default event-driven backend), with ONE writer thread:
//! `ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 1, block_size)`.
//!
//! Writes: `enqueue_event(RouterEvent)` (sync; the writer thread applies it). Reads:
//! `backend().find_matches(&[LocalBlockHash], false)` inline on the caller thread, which is
//! exactly what `ThreadPoolIndexer`'s `KvIndexerInterface::find_matches` does (minus the
//! async-trait box). Visibility: `flush()` waits on `flush_and_wait()`, the FIFO barrier the
//! crate's own tests use (`flush_and_settle`), so every query sees every earlier write. Event
//! application errors on the writer thread are only logged through `tracing` (no subscriber
//! installed here), so they are not counted; answer mismatches would reveal them.

use crate::dynamo_radix::{to_answer, to_locals, EventMaker};
use crate::index::Index;
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, SyncIndexer, ThreadPoolIndexer};
use prefixlog_workload::BlockHashes;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Block size in tokens; only used by token-based APIs this harness does not call.
const KV_BLOCK_SIZE: u32 = 64;

pub struct DynamoCrtc {
    index: ThreadPoolIndexer<ConcurrentRadixTreeCompressed>,
    events: EventMaker,
    enqueue_errors: u64,
    flushes: u64,
}

impl DynamoCrtc {
    pub fn new() -> Self {
        Self {
            index: ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 1, KV_BLOCK_SIZE),
            events: EventMaker::default(),
            enqueue_errors: 0,
            flushes: 0,
        }
    }
}

impl Index for DynamoCrtc {
    fn name(&self) -> &str {
        "dynamo-crtc-threadpool"
    }

    fn stored(&mut self, worker: u32, parent: Option<u64>, blocks: &[BlockHashes]) {
        let ev = self.events.stored(worker, parent, blocks);
        if self.index.enqueue_event(ev).is_err() {
            self.enqueue_errors += 1;
        }
    }

    fn removed(&mut self, worker: u32, exts: &[u64]) {
        let ev = self.events.removed(worker, exts);
        if self.index.enqueue_event(ev).is_err() {
            self.enqueue_errors += 1;
        }
    }

    fn query(&mut self, locals: &[u64]) -> Vec<(u32, u32)> {
        to_answer(&self.index.backend().find_matches(&to_locals(locals), false))
    }

    fn flush(&mut self) {
        self.flushes += 1;
        block_on(self.index.flush_and_wait()).expect("thread-pool indexer flush");
    }

    fn notes(&self) -> String {
        format!("{} enqueue errors, {} flush barriers", self.enqueue_errors, self.flushes)
    }
}

/// Minimal executor for the crate's async barrier (its futures are tokio oneshot receivers,
/// which need no runtime): poll, park until woken, repeat.
fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

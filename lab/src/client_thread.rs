//! The benchmarks' measuring client: a thread of its own with a current-thread runtime, so the
//! client's allocations and polling stay off the threads being measured.

use std::future::Future;

/// The measuring client's thread, with a current-thread runtime of its own, started before
/// the workload is generated. Why not the main thread: glibc gives a thread that allocates an
/// arena of its own (up to 8 per core), and the main thread's is left fragmented by the
/// workload's generation (vectors of many sizes, most of them freed). A profile of the idle
/// phase with the client there put a quarter of the client's time in `_int_malloc`, walking a
/// large bin's free list for tonic's 8 KiB receive buffers and a 256-score answer's 14 KiB
/// list: harness cost, on the timed path of both RPCs.
pub(crate) struct ClientThread {
    jobs: std::sync::mpsc::Sender<ClientJob>,
}

type ClientJob = Box<dyn FnOnce(&tokio::runtime::Runtime) + Send>;

impl ClientThread {
    pub(crate) fn start() -> anyhow::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::channel::<ClientJob>();
        let (ready, started) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("bench-client".into()).spawn(move || {
            // Built here, so that this thread's first allocations bind it to its arena now.
            match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => {
                    let _ = ready.send(Ok(()));
                    for job in rx {
                        job(&rt);
                    }
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                }
            }
        })?;
        started.recv()??;
        Ok(Self { jobs })
    }

    /// Runs `f` to completion on the client thread.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl Future<Output = T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move |rt| {
                let _ = tx.send(rt.block_on(f));
            }))
            .map_err(|_| anyhow::anyhow!("the bench client thread has stopped"))?;
        Ok(rx.await?)
    }
}

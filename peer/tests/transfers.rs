//! Checkpoint transfers on the peer port (issue 34 item 7), served from a checkpoint store with
//! no broker involved: a transfer is the stored export byte for byte, streamed; transfers over
//! the limit are refused with RESOURCE_EXHAUSTED (a caller sees "busy" and asks another
//! replica); a receiver that stops reading is dropped after the stall timeout, freeing its slot.

use parking_lot::Mutex;
use prefixlog_engine::KeyspaceId;
use prefixlog_peer::{PeerClient, PeerService, ServeLimits};
use prefixlog_proto::v1 as pb;
use prefixlog_snapshot::{checkpoint, export_partitions, CheckpointStore};
use prefixlog_state::record::encode_kv_events;
use prefixlog_state::BlockHashes;
use prefixlog_state::{Applier, KvOp, LogIdentity, StateSettings, Tier};
use std::sync::Arc;
use std::time::Duration;

const P: u32 = 2;

fn identity() -> LogIdentity {
    LogIdentity {
        cluster_id: "c".into(),
        topic: "t".into(),
        partitions: P,
        owned: vec![0, 1],
        settings: StateSettings::default(),
    }
}

/// A state whose checkpoint is about 10 MiB: more transfer messages than the server queues and
/// HTTP/2's flow-control windows hold, so a receiver that does not read holds its transfer open.
fn state() -> Applier {
    let mut a = Applier::new(P, StateSettings::default());
    let ks = KeyspaceId::new("m", 16, 1);
    for w in 0..80u64 {
        for r in 0..4u64 {
            let blocks: Vec<BlockHashes> = (0..1000)
                .map(|j| (w << 40 | r << 20 | j, w << 32 | r << 16 | j))
                .map(BlockHashes::from)
                .collect();
            let parent = (r > 0).then(|| w << 40 | (r - 1) << 20 | 999);
            let v = encode_kv_events(
                &ks,
                w,
                0,
                1,
                r + 1,
                false,
                &[KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: parent, blocks }],
            );
            let p = prefixlog_engine::partition_of(w, P);
            let off = a.partition(p).next_offset;
            a.apply(p, off, 1_000 + r, Some(&v)).unwrap();
        }
    }
    a
}

struct Served {
    addr: String,
    store: Arc<CheckpointStore>,
    id: u64,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

async fn serve(limits: ServeLimits) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CheckpointStore::open(&dir.path().join("checkpoints")).unwrap());
    let applier = Arc::new(Mutex::new(state()));
    let (meta, _) = checkpoint(&applier, &store, &identity()).unwrap();
    let total: u64 = meta.keyspaces.iter().map(|k| k.bytes).sum();
    // More than HTTP/2's windows, the queue and a message in flight take together.
    assert!(total > 9 << 20, "a checkpoint of several transfer messages ({total} bytes)");
    let svc = PeerService::new(applier, Some(store.clone()), "a".into(), identity(), limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tonic::transport::Server::builder()
            .add_service(svc.into_server())
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Served { addr, store, id: meta.id, _dir: dir, stop: Some(stop) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_is_the_stored_export_byte_for_byte() {
    let s = serve(ServeLimits::default()).await;
    let client = PeerClient::default();
    let whole = client.fetch_export(&s.addr, &[]).await.unwrap();
    assert_eq!(whole, s.store.export(s.id).unwrap(), "streamed from the store as stored");
    let both = client.fetch_export(&s.addr, &[0, 1]).await.unwrap();
    assert_eq!(both, whole, "every partition it covers is the whole checkpoint");
    let one = client.fetch_export(&s.addr, &[1]).await.unwrap();
    assert_eq!(one, export_partitions(&s.store, s.id, &[1]).unwrap(), "a partition-filtered export");
    let loaded = client.fetch_checkpoint(&s.addr, &identity(), &[0, 1]).await.unwrap();
    assert_eq!(loaded.meta.id, s.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_over_the_limit_are_refused_and_a_stalled_receiver_frees_its_slot() {
    // A stall timeout of seconds: the slot must still be held when the second request comes
    // on a new connection, however loaded the machine.
    let s = serve(ServeLimits { checkpoint_transfers: 1, stall_timeout: Duration::from_secs(5) }).await;
    let client = PeerClient::default();
    // A receiver that takes one message and then stops reading.
    let mut raw = client.connect(&s.addr).await.unwrap();
    let mut held =
        raw.fetch_checkpoint(pb::FetchCheckpointRequest { partitions: vec![] }).await.unwrap().into_inner();
    let first = held.message().await.unwrap().unwrap();
    assert!(!first.last && first.data.len() == 1 << 20, "1 MiB messages");
    let busy = client.fetch_export(&s.addr, &[]).await.expect_err("one transfer at a time");
    assert!(busy.is_busy(), "{busy}");
    // The stalled receiver is dropped after the stall timeout, and the slot serves others.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let whole = loop {
        match client.fetch_export(&s.addr, &[]).await {
            Ok(w) => break w,
            Err(e) if e.is_busy() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the slot was not freed: {e}"),
        }
    };
    assert_eq!(whole, s.store.export(s.id).unwrap());
    // The held stream was cut before its end.
    let mut cut = false;
    loop {
        match held.message().await {
            Ok(Some(c)) if c.last => break,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                cut = true;
                break;
            }
        }
    }
    assert!(cut, "the stalled transfer did not run to its end");
    // A receiver that leaves frees its slot at once (no stall timeout needed).
    let mut left =
        raw.fetch_checkpoint(pb::FetchCheckpointRequest { partitions: vec![] }).await.unwrap().into_inner();
    left.message().await.unwrap().unwrap();
    drop(left);
    drop(raw);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match client.fetch_export(&s.addr, &[1]).await {
            Ok(_) => break,
            Err(e) if e.is_busy() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_sends_more_than_the_cap_is_refused() {
    let s = serve(ServeLimits::default()).await;
    let small = PeerClient { max_checkpoint_bytes: 1 << 20, ..PeerClient::default() };
    let e = small.fetch_export(&s.addr, &[]).await.expect_err("over the cap");
    assert!(matches!(e, prefixlog_peer::FetchError::TooLarge { .. }), "{e}");
}

/// Peak resident memory (VmHWM, KiB) since the last reset.
fn peak_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap()
}

/// Resets VmHWM to the current resident size (Linux: `echo 5 > /proc/self/clear_refs`).
fn reset_peak() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    peak_kib()
}

/// The measurement behind the README's numbers (run alone: `cargo test -p prefixlog-peer --test
/// transfers -- --ignored --nocapture`): peak memory of 4 concurrent transfers of a ~100 MiB
/// checkpoint, streamed, against building each export in memory first (what `FetchCheckpoint`
/// did before: load, export, copy into chunks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_transfer_memory() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CheckpointStore::open(&dir.path().join("checkpoints")).unwrap());
    let mut a = Applier::new(P, StateSettings::default());
    let ks = KeyspaceId::new("m", 16, 1);
    for w in 0..64u64 {
        for r in 0..64u64 {
            let blocks: Vec<BlockHashes> = (0..1000)
                .map(|j| (w << 40 | r << 20 | j, w << 32 | r << 16 | j))
                .map(BlockHashes::from)
                .collect();
            let parent = (r > 0).then(|| w << 40 | (r - 1) << 20 | 999);
            let v = encode_kv_events(
                &ks,
                w,
                0,
                1,
                r + 1,
                false,
                &[KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: parent, blocks }],
            );
            let p = prefixlog_engine::partition_of(w, P);
            let off = a.partition(p).next_offset;
            a.apply(p, off, 1_000, Some(&v)).unwrap();
        }
    }
    let applier = Arc::new(Mutex::new(a));
    let (meta, _) = checkpoint(&applier, &store, &identity()).unwrap();
    let mib = meta.keyspaces.iter().map(|k| k.bytes).sum::<u64>() as f64 / (1 << 20) as f64;
    drop(applier);
    let svc = PeerService::new(
        Arc::new(Mutex::new(Applier::new(P, StateSettings::default()))),
        Some(store.clone()),
        "a".into(),
        identity(),
        ServeLimits { checkpoint_transfers: 4, ..ServeLimits::default() },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tonic::transport::Server::builder()
            .add_service(svc.into_server())
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    let base = reset_peak();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = PeerClient::default().connect(&addr).await.unwrap();
            let mut s = c
                .fetch_checkpoint(pb::FetchCheckpointRequest { partitions: vec![] })
                .await
                .unwrap()
                .into_inner();
            let mut n = 0usize;
            while let Some(m) = s.message().await.unwrap() {
                n += m.data.len();
            }
            n
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap() > 0);
    }
    let streamed = peak_kib() - base;
    let base = reset_peak();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                let data = export_partitions(&store, meta.id, &[]).unwrap();
                let chunks: Vec<Vec<u8>> = data.chunks(1 << 20).map(<[u8]>::to_vec).collect();
                chunks.len()
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let built = peak_kib() - base;
    eprintln!(
        "[transfers] 4 concurrent transfers of a {mib:.0} MiB checkpoint: peak memory +{:.0} MiB streamed, \
         +{:.0} MiB built in memory first (the previous FetchCheckpoint)",
        streamed as f64 / 1024.0,
        built as f64 / 1024.0
    );
}

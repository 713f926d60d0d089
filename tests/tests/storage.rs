//! Storage faults (issue 34 item 9): the checkpoint store's files damaged on disk, and a full
//! data disk. In every case the replica starts (never a crash loop), from an older checkpoint,
//! a peer or the log, ends equal to what it had before, and takes checkpoints again.
//!
//! - a flipped byte inside an SST file: that checkpoint fails verification, the older one
//!   restores;
//! - a flipped byte in an SST's footer, the MANIFEST or CURRENT: RocksDB refuses to open the
//!   store (read-only too), so the directory is moved aside (kept, named in the log) and a fresh
//!   store created; the replica starts from a peer (`--bootstrap-from`) or the log;
//! - a full data disk (a small tmpfs mounted for the test, so root and `mount` are needed; where
//!   mounting is impossible the test says so and does not run that case, unless
//!   `PREFIXLOG_REQUIRE_TMPFS=1`): checkpoints fail, counted as `no_space`, while ingest and
//!   queries go on; a restart on the full disk opens the store read-only and restores from it;
//!   once space returns the store reopens itself and checkpoints resume.
//!
//! Runs on every available backend (the broker only carries the log here).

use prefixlog_engine::{KeyspaceId, MatchOptions};
use prefixlog_ingest::{KafkaConnection, LogSpec, Publisher};
use prefixlog_node::{CheckpointPolicy, NodeOptions, ReplicaNode, StateSource};
use prefixlog_snapshot::Opened;
use prefixlog_state::BlockHashes;
use prefixlog_state::NextOffset;
use prefixlog_state::{token_of, KvOp, Landed, StateSettings, Tier};
use prefixlog_tests::{kafka_backends, unique_topic, KafkaBackend};
use std::path::{Path, PathBuf};
use std::time::Duration;

const P: u32 = 2;
const WORKERS: u64 = 6;

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

async fn new_log(b: &KafkaBackend) -> LogSpec {
    let topic = unique_topic("prefixlog.storage");
    b.create_topic(&topic, P).await.unwrap();
    LogSpec::new(KafkaConnection::new(&b.brokers), topic, P)
        .with_settings(StateSettings { digest_interval: 5, ..Default::default() })
}

fn opts(name: &str, dir: &Path) -> NodeOptions {
    NodeOptions {
        replica_id: name.into(),
        admin_addr: None,
        data_dir: Some(dir.to_path_buf()),
        checkpoints: CheckpointPolicy { interval: Duration::ZERO, records: 0, ..Default::default() },
        anti_entropy_interval: Duration::from_secs(3600),
        ..NodeOptions::default()
    }
}

async fn publish(p: &Publisher, rounds: std::ops::Range<u64>, seqs: &mut [u64]) -> Vec<NextOffset> {
    let mut landed: Vec<Landed> = Vec::new();
    for round in rounds {
        for w in 0..WORKERS {
            seqs[w as usize] += 1;
            let blocks: Vec<BlockHashes> = (0..8)
                .map(|j| (w << 40 | round << 8 | j, 1 + j + round * 10))
                .map(BlockHashes::from)
                .collect();
            let ops = [KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: None, blocks }];
            landed.push(
                p.publish_kv_events(&ks(), w, 0, 1, seqs[w as usize], false, &ops, None).await.unwrap(),
            );
        }
    }
    token_of(&landed)
}

async fn caught_up(n: &ReplicaNode, token: &[NextOffset]) {
    assert!(n.status().wait_for(token, Duration::from_secs(60)).await, "caught up");
}

async fn ready(n: &ReplicaNode) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !n.ready().0 {
        assert!(tokio::time::Instant::now() < deadline, "not ready: {}", n.ready().1);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn digests(n: &ReplicaNode) -> Vec<(i64, u64)> {
    let a = n.applier().lock();
    (0..P).map(|p| (a.partition(p).next_offset, a.partition_digest(p))).collect()
}

/// The store's files named like `pat`, oldest first (RocksDB numbers files as it creates them).
fn files(store: &Path, pat: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(pat))
        .collect();
    v.sort();
    v
}

/// Flips one byte of `file` at the offset `at(len)` picks.
fn flip(file: &Path, at: impl Fn(usize) -> usize) {
    let mut v = std::fs::read(file).unwrap();
    let i = at(v.len());
    v[i] ^= 0x5a;
    std::fs::write(file, v).unwrap();
}

/// A replica with two checkpoints, killed (as a crash: nothing written at stop). Returns its
/// digests when killed, the token of everything published, and the checkpoint ids.
async fn two_checkpoints(
    spec: &LogSpec,
    dir: &Path,
    seqs: &mut [u64],
) -> (Vec<(i64, u64)>, Vec<NextOffset>, [u64; 2]) {
    let publisher = Publisher::new(spec).unwrap();
    let a = ReplicaNode::start(spec.clone(), opts("a", dir)).await.unwrap();
    let tok = publish(&publisher, 0..6, seqs).await;
    caught_up(&a, &tok).await;
    let first = a.checkpoint_now().unwrap().unwrap().id;
    let tok = publish(&publisher, 6..12, seqs).await;
    caught_up(&a, &tok).await;
    let second = a.checkpoint_now().unwrap().unwrap().id;
    let before = digests(&a);
    a.kill().await;
    (before, tok, [first, second])
}

/// Restarts on the damaged store, checks the state it ends with, and that a checkpoint and a
/// second restart work (no crash loop).
async fn restart_and_recover(
    spec: &LogSpec,
    o: NodeOptions,
    tok: &[NextOffset],
    before: &[(i64, u64)],
) -> ReplicaNode {
    let b = ReplicaNode::start(spec.clone(), o.clone()).await.expect("starts on a damaged store");
    caught_up(&b, tok).await;
    ready(&b).await;
    assert_eq!(digests(&b), before, "the same state as before the damage");
    let meta = b.checkpoint_now().expect("checkpoints are written again").unwrap();
    b.kill().await;
    let c = ReplicaNode::start(spec.clone(), o).await.expect("and starts again");
    assert_eq!(c.store_opened(), Some(&Opened::Normally));
    assert_eq!(c.source(), &StateSource::LocalCheckpoint(meta.id));
    caught_up(&c, tok).await;
    assert_eq!(digests(&c), before);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_inside_an_sst_falls_back_to_the_older_checkpoint() {
    let mut ran = Vec::new();
    for backend in kafka_backends().await {
        let spec = new_log(&backend).await;
        let dir = tempfile::tempdir().unwrap();
        let mut seqs = vec![0u64; WORKERS as usize];
        let (before, tok, [first, _]) = two_checkpoints(&spec, dir.path(), &mut seqs).await;
        // The newest table file holds the newest checkpoint (each is flushed to its own).
        let sst = files(&dir.path().join("checkpoints"), ".sst").pop().unwrap();
        flip(&sst, |n| n / 2);
        let b = ReplicaNode::start(spec.clone(), opts("a", dir.path())).await.unwrap();
        assert_eq!(b.store_opened(), Some(&Opened::Normally), "the store opens; the damage is in a value");
        assert_eq!(b.source(), &StateSource::LocalCheckpoint(first), "the older checkpoint");
        b.kill().await;
        restart_and_recover(&spec, opts("a", dir.path()), &tok, &before).await.kill().await;
        ran.push(backend.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// Damage RocksDB refuses to open a store with: the directory is moved aside, intact for
/// forensics, and the replica starts afresh from a peer (footer case) or the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_sst_footer_manifest_or_current_moves_the_store_aside() {
    let mut ran = Vec::new();
    for backend in kafka_backends().await {
        for case in ["sst footer", "MANIFEST", "CURRENT"] {
            damaged_metadata(&backend, case).await;
        }
        ran.push(backend.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn damaged_metadata(backend: &KafkaBackend, case: &str) {
    let spec = new_log(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut seqs = vec![0u64; WORKERS as usize];
    let (before, tok, _) = two_checkpoints(&spec, dir.path(), &mut seqs).await;
    let store = dir.path().join("checkpoints");
    let damaged = match case {
        "sst footer" => files(&store, ".sst").pop().unwrap(),
        "MANIFEST" => files(&store, "MANIFEST-").pop().unwrap(),
        _ => store.join("CURRENT"),
    };
    match case {
        "sst footer" => flip(&damaged, |n| n - 10),
        "MANIFEST" => flip(&damaged, |n| n / 2),
        _ => flip(&damaged, |_| 3),
    }
    let damaged_bytes = std::fs::read(&damaged).unwrap();
    // The footer case starts from a healthy peer's checkpoint, the others from the log.
    let peer_dir = tempfile::tempdir().unwrap();
    let peer = if case == "sst footer" {
        let p = ReplicaNode::start(spec.clone(), opts("peer", peer_dir.path())).await.unwrap();
        caught_up(&p, &tok).await;
        p.checkpoint_now().unwrap();
        Some(p)
    } else {
        None
    };
    let mut o = opts("a", dir.path());
    o.bootstrap_from = peer.as_ref().map(|p| p.peer_addr().unwrap().to_string());
    let b = ReplicaNode::start(spec.clone(), o.clone()).await.unwrap_or_else(|e| panic!("{case}: {e}"));
    let Some(Opened::Quarantined { moved_to, why }) = b.store_opened().cloned() else {
        panic!("{case}: the store is moved aside: {:?}", b.store_opened())
    };
    assert!(why.contains("Corruption"), "{case}: {why}");
    let kept = moved_to.join(damaged.file_name().unwrap());
    assert_eq!(std::fs::read(&kept).unwrap(), damaged_bytes, "{case}: the damaged store is kept as it was");
    match &peer {
        Some(p) => assert!(
            matches!(b.source(), StateSource::Peer { peer, .. } if *peer == p.peer_addr().unwrap().to_string()),
            "{case}: {:?}",
            b.source()
        ),
        None => assert_eq!(b.source(), &StateSource::LogStart, "{case}"),
    }
    let text = prometheus::TextEncoder::new().encode_to_string(&b.registry().gather()).unwrap();
    assert!(
        text.contains("prefixlog_checkpoint_store_quarantined_total{shard=\"all\"} 1"),
        "{case}:\n{text}"
    );
    b.kill().await;
    o.bootstrap_from = None;
    restart_and_recover(&spec, o, &tok, &before).await.kill().await;
    if let Some(p) = peer {
        p.kill().await;
    }
}

/// A tmpfs of `mib` MiB mounted at a fresh directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u32) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount -t tmpfs: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the file system: a file appended to until the disk is full (again: RocksDB
    /// deletes the partial file of a failed flush, which frees a little). Returns it.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let block = vec![0u8; 64 << 10];
        while f.write_all(&block).and_then(|()| f.flush()).is_ok() {}
        // Whatever a partial block left: byte by byte.
        while f.write_all(&[0]).is_ok() {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a replica killed by a failing test may still hold files open.
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

fn failures(n: &ReplicaNode, reason: &str) -> u64 {
    let text = prometheus::TextEncoder::new().encode_to_string(&n.registry().gather()).unwrap();
    let prefix = format!("prefixlog_checkpoint_failures_total{{reason=\"{reason}\",shard=\"all\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |v| v.parse().unwrap())
}

fn answers(n: &ReplicaNode) -> bool {
    let chain: Vec<u64> = (0..8).map(|j| 1 + j).collect();
    n.engine().match_chain(&ks(), &chain, &MatchOptions::default()).is_some_and(|m| !m.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_disk_stops_checkpoints_not_the_replica_and_they_resume() {
    let tmpfs = match Tmpfs::mount(24) {
        Ok(t) => t,
        Err(why) => {
            assert!(
                std::env::var("PREFIXLOG_REQUIRE_TMPFS").is_err(),
                "PREFIXLOG_REQUIRE_TMPFS is set: {why}"
            );
            eprintln!("[storage] full data disk: NOT RUN (a tmpfs cannot be mounted here: {why})");
            return;
        }
    };
    let mut ran = Vec::new();
    for backend in kafka_backends().await {
        let dir = tmpfs.path().join(backend.name);
        full_disk(&backend, &tmpfs, &dir).await;
        let _ = std::fs::remove_dir_all(&dir);
        ran.push(backend.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn full_disk(backend: &KafkaBackend, tmpfs: &Tmpfs, dir: &Path) {
    let spec = new_log(backend).await;
    let publisher = Publisher::new(&spec).unwrap();
    let mut seqs = vec![0u64; WORKERS as usize];
    let a = ReplicaNode::start(spec.clone(), opts("a", dir)).await.unwrap();
    let tok = publish(&publisher, 0..6, &mut seqs).await;
    caught_up(&a, &tok).await;
    let first = a.checkpoint_now().unwrap().unwrap();

    let filler = tmpfs.fill();
    let tok = publish(&publisher, 6..12, &mut seqs).await;
    caught_up(&a, &tok).await;
    let err = a.checkpoint_now().expect_err("no room for a checkpoint");
    assert!(err.is_no_space(), "{err}");
    // Retried (the store reopens first), still no room: counted again, as no_space.
    tmpfs.fill();
    let err = a.checkpoint_now().expect_err("still no room");
    assert!(err.is_no_space(), "{err}");
    assert_eq!(failures(&a, "no_space"), 2);
    assert_eq!(failures(&a, "error"), 0);
    // Ingest and queries go on.
    let tok = publish(&publisher, 12..18, &mut seqs).await;
    caught_up(&a, &tok).await;
    assert!(answers(&a));
    ready(&a).await;
    let before = digests(&a);

    // A restart on the full disk: the store opens read-only and its checkpoint restores.
    a.kill().await;
    tmpfs.fill();
    let b = ReplicaNode::start(spec.clone(), opts("a", dir)).await.expect("starts on a full disk");
    assert!(
        matches!(b.store_opened(), Some(Opened::ReadOnly { why }) if why.contains("No space")),
        "{:?}",
        b.store_opened()
    );
    assert_eq!(b.source(), &StateSource::LocalCheckpoint(first.id));
    caught_up(&b, &tok).await;
    ready(&b).await;
    assert_eq!(digests(&b), before);
    tmpfs.fill();
    assert!(b.checkpoint_now().expect_err("still full").is_no_space());

    // Space returns: the next checkpoint reopens the store and is written.
    std::fs::remove_file(filler).unwrap();
    let meta = b.checkpoint_now().expect("checkpoints resume once space returns").unwrap();
    assert!(b.store().unwrap().health().writable);
    b.kill().await;
    let c = ReplicaNode::start(spec.clone(), opts("a", dir)).await.unwrap();
    assert_eq!(c.store_opened(), Some(&Opened::Normally));
    assert_eq!(c.source(), &StateSource::LocalCheckpoint(meta.id));
    caught_up(&c, &tok).await;
    assert_eq!(digests(&c), before);
    c.kill().await;
}

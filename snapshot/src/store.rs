//! Checkpoints in RocksDB.
//!
//! Layout (keys big-endian so byte order is numeric order):
//! - `i{id}` → the checkpoint's meta (index entry; listing scans only these);
//! - `p{id}` → every partition's applier state (offsets, log time, feeds, counters);
//! - `k{id}{ks}{chunk}` → a keyspace's encoded dump, in chunks of at most 4 MiB.
//!
//! A checkpoint is written in **one** `WriteBatch` with `sync`, so after a crash it exists whole
//! or not at all; the meta carries the length and xxh3 checksum of every other value, and its own
//! checksum, so corruption or truncation on disk is detected before anything is applied.
//!
//! The meta also carries the checkpoint's [`LogIdentity`]: cluster, topic, partition count, the
//! partitions it covers, and the [`prefixlog_state::StateSettings`] it was applied with.
//!
//! Readers beside a live replica ([`CheckpointStore::open_reader`]: the `checkpoints` and
//! `audit` commands) open the store as a RocksDB *secondary* instance, which follows the
//! primary's files and tolerates its WAL rotation and compactions (a read-only open stats WAL
//! files that the primary may delete in the meantime and failed intermittently).

use crate::capture::Capture;
use crate::error::{damaged, verify, Damage, Part, StoreError};
use crate::export::{decode_loaded, encode_parts, pack_export, unpack_export, Loaded};
use crate::format::FORMAT_VERSION;
use crate::handle::{classify, move_aside, open_or_read_only, options, Failure, Handle, Mode, Opened};
use crate::meta::{
    covered, decode_meta, encode_meta, keyspace_checksum_with, meta_of, CheckpointMeta, Covered,
    EncodedKeyspace, KeyspaceEntry, CHUNK,
};
use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard};
use prefixlog_state::LogIdentity;
use rocksdb::{Options, ReadOptions, WriteBatch, WriteOptions, DB};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use xxhash_rust::xxh3::xxh3_64;

/// Meta, encoded partition state and encoded keyspaces of one checkpoint.
type RawCheckpoint = (CheckpointMeta, Vec<u8>, Vec<Vec<u8>>);

/// What to keep: the newest `keep_last`, plus the oldest checkpoint of every
/// `thin_interval_ms` of log time within `window_ms` of the newest (for audits).
#[derive(Clone, Debug)]
pub struct Retention {
    pub keep_last: usize,
    pub thin_interval_ms: u64,
    pub window_ms: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self { keep_last: 3, thin_interval_ms: 3_600_000, window_ms: 24 * 3_600_000 }
    }
}

/// How a store is doing, for metrics and readiness of its checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreHealth {
    /// Checkpoints can be written now (false: read-only or unavailable until a reopen works).
    pub writable: bool,
    /// Times a damaged store directory was moved aside and a fresh store started.
    pub quarantined: u64,
    /// Times the store was reopened after a failed write.
    pub reopened: u64,
}

pub struct CheckpointStore {
    handle: RwLock<Handle>,
    path: PathBuf,
    /// A replica's store moves a store found damaged aside and starts afresh; a tool's store
    /// returns the error.
    quarantine_on_damage: bool,
    /// Held while a checkpoint is written: ids are chosen as newest + 1.
    write_lock: parking_lot::Mutex<()>,
    /// Set for a reader beside a live primary: its secondary directory (removed on drop).
    secondary: Option<PathBuf>,
    quarantined: AtomicU64,
    reopened: AtomicU64,
}

impl Drop for CheckpointStore {
    fn drop(&mut self) {
        if let Some(dir) = self.secondary.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Reads of checkpoint values: RocksDB's block checksums off (every value is verified end to
/// end against the checksums the meta records, and the meta carries its own), the block cache
/// skipped (a checkpoint is read once).
pub(crate) fn unverified() -> ReadOptions {
    let mut o = ReadOptions::default();
    o.fill_cache(false);
    o.set_verify_checksums(false);
    o
}

pub(crate) fn key(tag: u8, id: u64) -> Vec<u8> {
    let mut k = vec![tag];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

pub(crate) fn chunk_key(id: u64, ks: u32, chunk: u32) -> Vec<u8> {
    let mut k = key(b'k', id);
    k.extend_from_slice(&ks.to_be_bytes());
    k.extend_from_slice(&chunk.to_be_bytes());
    k
}

impl CheckpointStore {
    fn with_handle(path: &Path, handle: Handle, quarantine_on_damage: bool) -> Self {
        Self {
            handle: RwLock::new(handle),
            path: path.to_path_buf(),
            quarantine_on_damage,
            write_lock: Default::default(),
            secondary: None,
            quarantined: AtomicU64::new(0),
            reopened: AtomicU64::new(0),
        }
    }

    /// Opens a reader beside a store that a running replica may hold open and keep writing
    /// (audits, the `checkpoints` command): a RocksDB secondary instance in a private temporary
    /// directory, caught up with the primary once at open. It sees every checkpoint committed
    /// before the open; its open files keep them readable while the primary deletes old ones.
    pub fn open_reader(path: &Path) -> Result<Self, StoreError> {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let secondary = std::env::temp_dir().join(format!("prefixlog-reader-{}-{n}", std::process::id()));
        let reader_err = |source| StoreError::Reader { path: path.to_path_buf(), source };
        let mut o = Options::default();
        // A secondary must keep every table file open: the primary deletes compacted files.
        o.set_max_open_files(-1);
        let db = DB::open_as_secondary(&o, path, &secondary).map_err(reader_err)?;
        db.try_catch_up_with_primary().map_err(reader_err)?;
        let mut store = Self::with_handle(path, Handle { db: Some(db), mode: Mode::Secondary }, false);
        store.secondary = Some(secondary);
        Ok(store)
    }

    /// Opens (or creates) a store read-write; any failure is returned (tools, tests).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = DB::open(&options(), path)?;
        Ok(Self::with_handle(path, Handle { db: Some(db), mode: Mode::ReadWrite }, false))
    }

    /// Opens a replica's store so that a disk problem never stops the replica from starting
    /// (see [`crate::handle`]): read-only on a full disk, a damaged directory moved aside for a
    /// fresh store. Fails only when another process holds the store or it may not be used.
    pub fn open_for_replica(path: &Path) -> Result<(Self, Opened), StoreError> {
        let (handle, opened) = match open_or_read_only(path) {
            Ok(h) => {
                let opened = match (&h.mode, &h.db) {
                    (Mode::Reopen { why }, Some(_)) => Opened::ReadOnly { why: why.clone() },
                    (Mode::Reopen { why }, None) => Opened::Unavailable { why: why.clone() },
                    _ => Opened::Normally,
                };
                (h, opened)
            }
            Err((e, Failure::Refused)) => return Err(e.into()),
            Err((e, _)) => {
                let why = e.to_string();
                let moved_to = move_aside(path).map_err(|source| StoreError::MoveAside {
                    path: path.to_path_buf(),
                    why: why.clone(),
                    source,
                })?;
                let h = open_or_read_only(path).map_err(|(e, _)| e)?;
                (h, Opened::Quarantined { moved_to, why })
            }
        };
        let store = Self::with_handle(path, handle, true);
        if matches!(opened, Opened::Quarantined { .. }) {
            store.quarantined.fetch_add(1, Ordering::Relaxed);
        }
        Ok((store, opened))
    }

    /// The open database, for reads.
    pub(crate) fn db(&self) -> Result<MappedRwLockReadGuard<'_, DB>, StoreError> {
        RwLockReadGuard::try_map(self.handle.read(), |h| h.db.as_ref()).map_err(|h| {
            let why = match &h.mode {
                Mode::Reopen { why } => why.clone(),
                _ => "not open".into(),
            };
            StoreError::Unavailable { path: self.path.clone(), why }
        })
    }

    pub fn health(&self) -> StoreHealth {
        StoreHealth {
            writable: self.handle.read().mode == Mode::ReadWrite,
            quarantined: self.quarantined.load(Ordering::Relaxed),
            reopened: self.reopened.load(Ordering::Relaxed),
        }
    }

    /// Makes the store writable before a write: reopens it when a write failed or the disk
    /// was full, or moves it aside when it turns out damaged. The caller holds `write_lock`.
    fn ready_to_write(&self) -> Result<(), StoreError> {
        let mut h = self.handle.write();
        match &h.mode {
            Mode::ReadWrite => return Ok(()),
            Mode::Secondary => {
                return Err(StoreError::Unavailable { path: self.path.clone(), why: "a reader".into() })
            }
            Mode::Reopen { .. } => {}
        }
        h.db = None; // RocksDB allows one open handle per directory: close before reopening
        match open_or_read_only(&self.path) {
            Ok(fresh) => *h = fresh,
            Err((e, Failure::Damaged)) if self.quarantine_on_damage => {
                drop(h);
                return self.quarantine(e.as_ref());
            }
            Err((e, _)) => {
                h.mode = Mode::Reopen { why: e.to_string() };
                return Err(e.into());
            }
        }
        match &h.mode {
            Mode::ReadWrite => {
                self.reopened.fetch_add(1, Ordering::Relaxed);
                tracing::info!(path = %self.path.display(), "checkpoint store reopened; writable again");
                Ok(())
            }
            Mode::Reopen { why } => {
                Err(StoreError::Unavailable { path: self.path.clone(), why: why.clone() })
            }
            Mode::Secondary => unreachable!("reopened read-write or read-only"),
        }
    }

    /// Moves this store's directory aside (kept for forensics) and starts a fresh store there.
    fn quarantine(&self, why: &str) -> Result<(), StoreError> {
        let mut h = self.handle.write();
        h.db = None;
        let moved_to = match move_aside(&self.path) {
            Ok(to) => to,
            Err(source) => {
                h.mode = Mode::Reopen { why: why.to_string() };
                return Err(StoreError::MoveAside { path: self.path.clone(), why: why.to_string(), source });
            }
        };
        self.quarantined.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            path = %self.path.display(),
            moved_to = %moved_to.display(),
            error = why,
            "the checkpoint store is damaged: moved aside (kept for forensics: inspect, then delete it) \
             and a fresh store started in its place; older checkpoints in it are no longer used"
        );
        match open_or_read_only(&self.path) {
            Ok(fresh) => *h = fresh,
            Err((e, _)) => {
                h.mode = Mode::Reopen { why: e.to_string() };
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// After a failed write or flush: a damaged store is moved aside now; otherwise (a full
    /// disk, an I/O error) RocksDB refuses further writes until reopened, so the next write
    /// reopens it.
    fn write_failed(&self, e: &rocksdb::Error) {
        if classify(e) == Failure::Damaged && self.quarantine_on_damage {
            if let Err(q) = self.quarantine(e.as_ref()) {
                tracing::error!(error = %q, "moving the damaged checkpoint store aside failed");
            }
            return;
        }
        let mut h = self.handle.write();
        if h.mode == Mode::ReadWrite {
            h.mode = Mode::Reopen { why: e.to_string() };
        }
    }

    /// Checkpoint ids, newest first (none when the store cannot be read). Read without
    /// RocksDB's block checksums, like every value here (each carries its own): a flipped byte
    /// in a table block that also holds a large keyspace value must fail that checkpoint's
    /// verification, not end the listing and hide the older checkpoints in healthy files.
    pub fn ids(&self) -> Vec<u64> {
        let Ok(db) = self.db() else { return Vec::new() };
        let mut ids: Vec<u64> = db
            .iterator_opt(rocksdb::IteratorMode::From(b"i", rocksdb::Direction::Forward), unverified())
            .filter_map(|kv| kv.ok())
            .take_while(|(k, _)| k.first() == Some(&b'i'))
            .filter_map(|(k, _)| k.get(1..9).map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes"))))
            .collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids
    }

    /// Writes a checkpoint atomically. Returns its meta.
    /// Writes a captured state (its partitions, keyspaces and per-partition digests).
    pub fn write(
        &self,
        identity: &LogIdentity,
        state: &Capture,
        created_unix_ms: u64,
    ) -> Result<CheckpointMeta, StoreError> {
        let (pbytes, ks) = encode_parts(state);
        let covered = covered(&state.partitions, &state.digests);
        self.write_encoded(FORMAT_VERSION, identity, covered, &pbytes, &ks, created_unix_ms)
    }

    /// Writes a format-2 checkpoint (keyspaces as columnar dumps), as the previous release did:
    /// for the upgrade test only.
    #[cfg(any(test, feature = "testing"))]
    pub fn write_format2_for_test(
        &self,
        identity: &LogIdentity,
        partitions: &[prefixlog_state::PartitionState],
        digests: &[u64],
        dumps: &[prefixlog_engine::KeyspaceDump],
    ) -> Result<CheckpointMeta, StoreError> {
        let pbytes = crate::upgrade::partitions::encode_partitions(partitions);
        let values: Vec<Vec<u8>> = dumps.iter().map(crate::upgrade::dump::encode_keyspace).collect();
        let ks: Vec<EncodedKeyspace> =
            dumps.iter().zip(&values).map(|(d, v)| (d.id.clone(), v.as_slice(), d.holder_blocks())).collect();
        self.write_encoded(2, identity, covered(partitions, digests), &pbytes, &ks, 0)
    }

    /// Writes a format-4 checkpoint (images, no digest points), as the previous release did:
    /// for the upgrade test only.
    #[cfg(any(test, feature = "testing"))]
    pub fn write_format4_for_test(
        &self,
        identity: &LogIdentity,
        state: &Capture,
    ) -> Result<CheckpointMeta, StoreError> {
        let pbytes = crate::upgrade::partitions::encode_partitions(&state.partitions);
        let ks: Vec<EncodedKeyspace> =
            state.keyspaces.iter().map(|k| (k.id.clone(), k.bytes.as_slice(), k.holder_blocks)).collect();
        self.write_encoded(4, identity, covered(&state.partitions, &state.digests), &pbytes, &ks, 0)
    }

    #[allow(clippy::too_many_arguments)]
    fn write_encoded(
        &self,
        format: u32,
        identity: &LogIdentity,
        covered: Covered,
        pbytes: &[u8],
        keyspaces: &[EncodedKeyspace],
        created_unix_ms: u64,
    ) -> Result<CheckpointMeta, StoreError> {
        let _writing = self.write_lock.lock();
        self.ready_to_write()?;
        let id = self.ids().first().map_or(1, |i| i + 1);
        let meta = meta_of(id, format, identity, covered, pbytes, keyspaces, created_unix_ms);
        let mut batch = WriteBatch::default();
        for (ki, (_, bytes, _)) in keyspaces.iter().enumerate() {
            for (ci, c) in bytes.chunks(CHUNK).enumerate() {
                batch.put(chunk_key(id, ki as u32, ci as u32), c);
            }
        }
        batch.put(key(b'p', id), pbytes);
        batch.put(key(b'i', id), encode_meta(&meta));
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        let db = self.db()?;
        if let Err(e) = db.write_opt(batch, &wo) {
            drop(db);
            self.write_failed(&e);
            return Err(e.into());
        }
        // Move the checkpoint from the write-ahead log into a table file now: otherwise the
        // next open replays it from the WAL (measured: 2.7 s of a 6.6 s restart for 11.5M
        // holder-blocks). Atomicity and durability came from the synced batch above; a crash
        // during the flush leaves the WAL, which still holds the whole batch. So a failed flush
        // is not a failed checkpoint: the checkpoint is committed (and the next open replays it).
        if let Err(e) = db.flush() {
            drop(db);
            tracing::warn!(checkpoint = id, error = %e, "flushing a written checkpoint failed; the next open replays it from the WAL");
            self.write_failed(&e);
        }
        Ok(meta)
    }

    /// The meta of a checkpoint (its own checksum verified; contents not read).
    pub fn meta(&self, id: u64) -> Result<CheckpointMeta, StoreError> {
        let v = self.db()?.get_opt(key(b'i', id), &unverified())?.ok_or(StoreError::NoSuchCheckpoint(id))?;
        decode_meta(id, &v)
    }

    /// A verified checkpoint as one self-describing byte string (for transfer to another
    /// replica): magic, then length-prefixed meta, partition state and keyspace values.
    pub fn export(&self, id: u64) -> Result<Vec<u8>, StoreError> {
        let (meta, pbytes, ks) = self.raw(id)?;
        let ks: Vec<&[u8]> = ks.iter().map(Vec::as_slice).collect();
        Ok(pack_export(&meta, &pbytes, &ks))
    }

    /// Verifies an exported checkpoint and stores it under a new local id.
    pub fn import(&self, data: &[u8]) -> Result<CheckpointMeta, StoreError> {
        let (meta, pbytes, ks) = unpack_export(data)?;
        let ks: Vec<EncodedKeyspace> =
            meta.keyspaces.iter().zip(ks).map(|(e, b)| (e.id.clone(), b, e.holder_blocks)).collect();
        let covered = Covered {
            offsets: meta.offsets.clone(),
            log_times: meta.log_times.clone(),
            digests: meta.digests.clone(),
            marks: meta.marks.clone(),
        };
        self.write_encoded(meta.format, &meta.identity, covered, pbytes, &ks, meta.created_unix_ms)
    }

    /// Meta, partition bytes and keyspace bytes of a checkpoint, all checksums verified.
    fn raw(&self, id: u64) -> Result<RawCheckpoint, StoreError> {
        let meta = self.meta(id)?;
        let pbytes = self
            .db()?
            .get_opt(key(b'p', id), &unverified())?
            .ok_or_else(|| damaged(id, Part::PartitionState, Damage::Missing { chunk: None }))?;
        verify(id, Part::PartitionState, &pbytes, meta.partitions_len, meta.partitions_checksum)?;
        let mut out = Vec::with_capacity(meta.keyspaces.len());
        for (ki, e) in meta.keyspaces.iter().enumerate() {
            let (bytes, sums) = self.read_chunks(id, ki as u32, e)?;
            if keyspace_checksum_with(meta.format, &bytes, || sums) != e.checksum {
                return Err(damaged(id, Part::Keyspace(e.id.clone()), Damage::Checksum));
            }
            out.push(bytes);
        }
        Ok((meta, pbytes, out))
    }

    /// A keyspace value and the checksum of each chunk, its chunks read and checksummed by a
    /// few threads at once, straight into place (the restore is bound by this copy and the
    /// image decode, not by the disk: checkpoints are read back from the page cache). Chunks
    /// skip the block cache (a checkpoint is read once) and RocksDB's own block checksums (ours
    /// cover every byte end to end). The caller checks the chunk checksums against the meta.
    fn read_chunks(&self, id: u64, ki: u32, e: &KeyspaceEntry) -> Result<(Vec<u8>, Vec<u64>), StoreError> {
        let part = || Part::Keyspace(e.id.clone());
        let len = usize::try_from(e.bytes).unwrap_or(usize::MAX);
        let chunks = len.div_ceil(CHUNK);
        if chunks != e.chunks as usize {
            let damage = Damage::Length { expected: e.bytes, found: u64::from(e.chunks) * CHUNK as u64 };
            return Err(damaged(id, part(), damage));
        }
        // Zeroed by the allocator as fresh pages (no pass of its own); each is written once.
        let mut bytes = vec![0u8; len];
        let db = self.db()?;
        let db: &DB = &db;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
        let mut lanes: Vec<Vec<(u32, &mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
        for (ci, dst) in bytes.chunks_mut(CHUNK).enumerate() {
            lanes[ci % threads].push((ci as u32, dst));
        }
        let read = |lane: Vec<(u32, &mut [u8])>| -> Result<Vec<(u32, u64)>, StoreError> {
            let mut sums = Vec::with_capacity(lane.len());
            let once = unverified();
            for (ci, dst) in lane {
                let c = db
                    .get_pinned_opt(chunk_key(id, ki, ci), &once)?
                    .ok_or_else(|| damaged(id, part(), Damage::Missing { chunk: Some(ci) }))?;
                if c.len() != dst.len() {
                    let damage = Damage::Length { expected: dst.len() as u64, found: c.len() as u64 };
                    return Err(damaged(id, part(), damage));
                }
                crate::pages::populate(dst);
                dst.copy_from_slice(&c);
                sums.push((ci, xxh3_64(dst)));
            }
            Ok(sums)
        };
        let mut sums = std::thread::scope(|s| {
            let handles: Vec<_> = lanes.into_iter().map(|lane| s.spawn(move || read(lane))).collect();
            let lanes = handles.into_iter().map(|h| h.join().expect("a chunk reader panicked"));
            lanes.collect::<Result<Vec<_>, _>>()
        })?
        .concat();
        sums.sort_unstable();
        Ok((bytes, sums.into_iter().map(|(_, sum)| sum).collect()))
    }

    /// Reads, checksums and decodes a whole checkpoint.
    pub fn load(&self, id: u64) -> Result<Loaded, StoreError> {
        let (meta, pbytes, ks) = self.raw(id)?;
        decode_loaded(meta, &pbytes, ks)
    }

    /// Deletes checkpoints outside the retention policy. Returns the deleted ids.
    pub fn apply_retention(&self, r: &Retention) -> Result<Vec<u64>, StoreError> {
        let metas: Vec<(u64, Option<u64>)> =
            self.ids().into_iter().map(|id| (id, self.meta(id).ok().map(|m| m.log_time()))).collect();
        let newest_time = metas.iter().filter_map(|m| m.1).max().unwrap_or(0);
        let mut keep_bucket = std::collections::BTreeMap::new();
        // Oldest first, so each bucket keeps its oldest checkpoint.
        for &(id, t) in metas.iter().rev() {
            if let Some(t) = t {
                if newest_time.saturating_sub(t) <= r.window_ms {
                    keep_bucket.entry(t / r.thin_interval_ms.max(1)).or_insert(id);
                }
            }
        }
        let keep: std::collections::BTreeSet<u64> =
            metas.iter().take(r.keep_last).map(|m| m.0).chain(keep_bucket.into_values()).collect();
        let mut deleted = Vec::new();
        for &(id, _) in &metas {
            if !keep.contains(&id) {
                self.delete(id)?;
                deleted.push(id);
            }
        }
        Ok(deleted)
    }

    /// Deletes one checkpoint (all its keys, in one batch).
    pub fn delete(&self, id: u64) -> Result<(), StoreError> {
        let mut b = WriteBatch::default();
        b.delete(key(b'i', id));
        b.delete(key(b'p', id));
        b.delete_range(key(b'k', id), key(b'k', id + 1));
        let db = self.db()?;
        if let Err(e) = db.write(b) {
            drop(db);
            self.write_failed(&e);
            return Err(e.into());
        }
        db.compact_range(Some(key(b'k', id)), Some(key(b'k', id + 1)));
        Ok(())
    }

    /// Test hook: overwrites a raw value (to simulate on-disk corruption).
    #[cfg(any(test, feature = "testing"))]
    pub fn corrupt_for_test(&self, id: u64, truncate: bool) -> Result<(), StoreError> {
        let k = chunk_key(id, 0, 0);
        let db = self.db()?;
        if let Some(mut v) = db.get(&k)? {
            if truncate {
                v.truncate(v.len() / 2);
            } else {
                let mid = v.len() / 2;
                if let Some(b) = v.get_mut(mid) {
                    *b ^= 0x5a;
                }
            }
            db.put(&k, v)?;
        }
        Ok(())
    }
}

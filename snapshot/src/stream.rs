//! A stored checkpoint's export streamed in bounded pieces (a peer's `FetchCheckpoint`): the
//! same bytes as [`CheckpointStore::export`], but never more than one stored chunk (4 MiB) in
//! memory, however large the checkpoint. Building the whole export first cost 2–5× the
//! checkpoint's size per concurrent transfer.
//!
//! The pieces are read under one RocksDB snapshot, so retention deleting the checkpoint
//! meanwhile does not cut the stream, and every value is verified as it passes (the partition
//! value against the meta; each keyspace's chunk checksums against its entry once its last
//! chunk is through): a damaged checkpoint ends the stream with an error before its last byte,
//! so a receiver never takes it for whole (it verifies everything again anyway).

use crate::error::{damaged, verify, Damage, Part, StoreError};
use crate::export::EXPORT_MAGIC;
use crate::meta::{decode_meta, encode_meta, keyspace_checksum, CheckpointMeta, KeyspaceEntry, CHUNK};
use crate::store::{chunk_key, key, unverified, CheckpointStore};
use rocksdb::{SnapshotWithThreadMode, DB};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// Where a streamed export goes.
pub trait ExportSink {
    /// Called once, before any byte: the checkpoint's id and the export's length. False: stop.
    fn begin(&mut self, checkpoint_id: u64, total_bytes: u64) -> bool;
    /// The next piece (at most one stored chunk). False: stop (the receiver went away).
    fn write(&mut self, piece: &[u8]) -> bool;
}

/// How a streamed export ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Streamed {
    /// Every byte was handed to the sink.
    Complete { bytes: u64 },
    /// The sink asked to stop.
    Stopped,
}

/// The length of an export: magic, then each value with its `u64` length prefix.
fn export_len(meta_len: usize, meta: &CheckpointMeta) -> u64 {
    let values = 8 + meta_len as u64 + 8 + meta.partitions_len;
    EXPORT_MAGIC.len() as u64 + values + meta.keyspaces.iter().map(|k| 8 + k.bytes).sum::<u64>()
}

impl CheckpointStore {
    /// Streams checkpoint `id`'s export (byte for byte what [`Self::export`] returns) into
    /// `sink`, verifying as it goes.
    pub fn export_to(&self, id: u64, sink: &mut dyn ExportSink) -> Result<Streamed, StoreError> {
        let db = self.db()?;
        let snap = db.snapshot();
        let mb = snap.get_opt(key(b'i', id), unverified())?.ok_or(StoreError::NoSuchCheckpoint(id))?;
        let meta = decode_meta(id, &mb)?;
        let pbytes = snap
            .get_opt(key(b'p', id), unverified())?
            .ok_or_else(|| damaged(id, Part::PartitionState, Damage::Missing { chunk: None }))?;
        verify(id, Part::PartitionState, &pbytes, meta.partitions_len, meta.partitions_checksum)?;
        let mb = encode_meta(&meta);
        if !sink.begin(id, export_len(mb.len(), &meta)) {
            return Ok(Streamed::Stopped);
        }
        let mut sent = 0u64;
        let mut put = |piece: &[u8]| {
            sent += piece.len() as u64;
            sink.write(piece)
        };
        let header =
            [EXPORT_MAGIC, &(mb.len() as u64).to_le_bytes(), &mb, &meta.partitions_len.to_le_bytes()];
        if !header.iter().all(|p| put(p)) || !put(&pbytes) {
            return Ok(Streamed::Stopped);
        }
        drop(pbytes);
        for (ki, e) in meta.keyspaces.iter().enumerate() {
            if !put(&e.bytes.to_le_bytes()) || !stream_keyspace(&snap, &meta, ki as u32, e, &mut put)? {
                return Ok(Streamed::Stopped);
            }
        }
        Ok(Streamed::Complete { bytes: sent })
    }
}

/// One keyspace's chunks, in order, each checked for its length, the whole against its entry's
/// checksum before its last chunk is handed on. Ok(false): the sink stopped.
fn stream_keyspace(
    snap: &SnapshotWithThreadMode<'_, DB>,
    meta: &CheckpointMeta,
    ki: u32,
    e: &KeyspaceEntry,
    put: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<bool, StoreError> {
    let (id, part) = (meta.id, || Part::Keyspace(e.id.clone()));
    let chunks = usize::try_from(e.bytes).unwrap_or(usize::MAX).div_ceil(CHUNK);
    if chunks != e.chunks as usize {
        let damage = Damage::Length { expected: e.bytes, found: u64::from(e.chunks) * CHUNK as u64 };
        return Err(damaged(id, part(), damage));
    }
    let (mut sums, mut whole) = (Vec::with_capacity(chunks), Xxh3::new());
    for ci in 0..chunks {
        let c = snap
            .get_pinned_opt(chunk_key(id, ki, ci as u32), unverified())?
            .ok_or_else(|| damaged(id, part(), Damage::Missing { chunk: Some(ci as u32) }))?;
        let want = if ci + 1 < chunks { CHUNK as u64 } else { e.bytes - (chunks as u64 - 1) * CHUNK as u64 };
        if c.len() as u64 != want {
            return Err(damaged(id, part(), Damage::Length { expected: want, found: c.len() as u64 }));
        }
        sums.push(xxh3_64(&c));
        if meta.format < 3 {
            whole.update(&c);
        }
        if ci + 1 == chunks {
            let sum = if meta.format >= 3 { keyspace_checksum(sums.iter().copied()) } else { whole.digest() };
            if sum != e.checksum {
                return Err(damaged(id, part(), Damage::Checksum));
            }
        }
        if !put(&c) {
            return Ok(false);
        }
    }
    Ok(true)
}

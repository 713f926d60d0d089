//! Checkpoints as one self-describing byte string, for transfer to another replica (bootstrap,
//! recovery of a cut partition, a new shard's partitions): magic, then the length-prefixed
//! meta, partition state and keyspace values, every one verified on the way in.

use crate::capture::Capture;
use crate::codec::{self, DecodeError};
use crate::error::{damaged, verify, Damage, Part, StoreError};
use crate::format::FORMAT_VERSION;
use crate::meta::{
    covered, decode_meta_named, encode_meta, meta_of, verify_keyspace, CheckpointMeta, EncodedKeyspace,
};
use prefixlog_engine::{EngineConfig, ImageError, Keyspace, KeyspaceDump, KeyspaceId, RebuildError};
use prefixlog_state::{DigestPoint, LogIdentity, PartitionState};

pub(crate) const EXPORT_MAGIC: &[u8] = b"PREFIXLOG-CHECKPOINT-1\n";

/// A verified checkpoint: partition state decoded, keyspaces checksummed (an image is decoded
/// by the restore that reads it, without hashing its sections again: see [`VerifiedImage`]).
pub struct Loaded {
    pub meta: CheckpointMeta,
    pub partitions: Vec<PartitionState>,
    /// Each partition's recorded digest points (format 5 on; empty before).
    pub points: Vec<Vec<DigestPoint>>,
    pub keyspaces: Vec<LoadedKeyspace>,
}

/// One keyspace of a loaded checkpoint, in its format's form.
pub struct LoadedKeyspace {
    pub id: KeyspaceId,
    pub holder_blocks: u64,
    pub state: StoredKeyspace,
}

pub enum StoredKeyspace {
    /// Format 3: an engine image, restored by bulk copies.
    Image(VerifiedImage),
    /// Format 2: a dump, rebuilt node by node.
    Dump(KeyspaceDump),
}

/// An image's bytes, every one verified against the checkpoint's meta (the store's chunk
/// checksums, or an export's keyspace checksum) before this was made: only this crate makes
/// one, so its restore need not hash the image's sections a second time.
pub struct VerifiedImage(Vec<u8>);

/// Why a stored keyspace (verified against its checksums) did not restore.
#[derive(Debug, thiserror::Error)]
pub enum KeyspaceRestoreError {
    #[error("its image is refused: {0}")]
    Image(#[from] ImageError),
    #[error("its dump does not rebuild: {0}")]
    Dump(#[from] RebuildError),
    #[error("the stored state is of keyspace {0}")]
    OtherKeyspace(KeyspaceId),
}

impl LoadedKeyspace {
    /// The keyspace, with holders filed into partitions under `cfg`.
    pub fn restore(&self, cfg: EngineConfig) -> Result<Keyspace, KeyspaceRestoreError> {
        let ks = match &self.state {
            StoredKeyspace::Image(image) => Keyspace::read_verified_image(&image.0, cfg)?,
            StoredKeyspace::Dump(d) => Keyspace::rebuild(d, cfg)?,
        };
        if ks.id() != &self.id {
            return Err(KeyspaceRestoreError::OtherKeyspace(ks.id().clone()));
        }
        Ok(ks)
    }
}

/// An export's parts, borrowed from it: meta, partition state, keyspace values.
pub(crate) type ExportParts<'a> = (CheckpointMeta, &'a [u8], Vec<&'a [u8]>);

pub(crate) fn decode_loaded(
    meta: CheckpointMeta,
    pbytes: &[u8],
    ks: Vec<Vec<u8>>,
) -> Result<Loaded, StoreError> {
    let (mut partitions, points) = codec::decode_partition_value(pbytes, meta.format)?;
    if partitions.len() != meta.offsets.len() {
        let damage = Damage::PartitionCount { meta: meta.offsets.len(), state: partitions.len() };
        return Err(damaged(meta.id, Part::PartitionState, damage));
    }
    // The record fingerprints live in the meta (format 4 on; none before: left unknown).
    for (p, &mark) in partitions.iter_mut().zip(&meta.marks) {
        p.last_mark = mark;
    }
    let mut keyspaces = Vec::with_capacity(ks.len());
    for (e, bytes) in meta.keyspaces.iter().zip(ks) {
        let state = if meta.format >= 3 {
            // Verified by every caller: the store checks each chunk as it lands, an import
            // checks the keyspace's checksum.
            StoredKeyspace::Image(VerifiedImage(bytes))
        } else {
            StoredKeyspace::Dump(crate::upgrade::dump::decode_keyspace(&bytes)?)
        };
        keyspaces.push(LoadedKeyspace { id: e.id.clone(), holder_blocks: e.holder_blocks, state });
    }
    Ok(Loaded { meta, partitions, points, keyspaces })
}

/// An export: the magic, then the meta, the partition value and each keyspace value, each
/// after its `u64` little-endian length (the framing of every format).
pub(crate) fn pack_export(meta: &CheckpointMeta, pbytes: &[u8], ks: &[&[u8]]) -> Vec<u8> {
    let mb = encode_meta(meta);
    let values = [&mb[..], pbytes].into_iter().chain(ks.iter().copied());
    let mut out = EXPORT_MAGIC.to_vec();
    for v in values {
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}

/// The next length-prefixed value of an export, taken off the front of `rest` (of the
/// `total` bytes after the magic).
fn next_value<'a>(rest: &mut &'a [u8], total: usize) -> Result<&'a [u8], DecodeError> {
    let at = total - rest.len();
    let truncated = |need| DecodeError::Truncated { at, need };
    let (len, tail) = rest.split_first_chunk::<8>().ok_or(truncated(8))?;
    let len = u64::from_le_bytes(*len);
    let len = usize::try_from(len).ok().filter(|&n| n <= tail.len());
    let len = len.ok_or(DecodeError::LengthExceedsValue(tail.len()))?;
    let (value, tail) = tail.split_at(len);
    *rest = tail;
    Ok(value)
}

/// The verified parts of an export (meta id = the exporting store's id).
pub(crate) fn unpack_export(data: &[u8]) -> Result<ExportParts<'_>, StoreError> {
    let rest = data.strip_prefix(EXPORT_MAGIC).ok_or(damaged(0, Part::Export, Damage::NotAnExport))?;
    let (mut r, total) = (rest, rest.len());
    let mb = next_value(&mut r, total)?;
    let meta = decode_meta_named(0, mb)?;
    let pbytes = next_value(&mut r, total)?;
    verify(meta.id, Part::PartitionState, pbytes, meta.partitions_len, meta.partitions_checksum)?;
    let mut ks = Vec::with_capacity(meta.keyspaces.len());
    for e in &meta.keyspaces {
        let b = next_value(&mut r, total)?;
        verify_keyspace(meta.id, meta.format, e, b)?;
        ks.push(b);
    }
    if !r.is_empty() {
        return Err(DecodeError::TrailingBytes(r.len()).into());
    }
    Ok((meta, pbytes, ks))
}

/// Verifies and decodes an export without storing it (recovering a partition from a peer).
pub fn decode_export(data: &[u8]) -> Result<Loaded, StoreError> {
    let (meta, pbytes, ks) = unpack_export(data)?;
    decode_loaded(meta, pbytes, ks.into_iter().map(<[u8]>::to_vec).collect())
}

/// An export of an in-memory state (a partition-filtered copy of a checkpoint): what
/// [`CheckpointStore::export`] would give had it been written, with id 0.
pub fn encode_export(identity: &LogIdentity, state: &Capture, created_unix_ms: u64) -> Vec<u8> {
    let (pbytes, ks) = encode_parts(state);
    let covered = covered(&state.partitions, &state.digests);
    let meta = meta_of(0, FORMAT_VERSION, identity, covered, &pbytes, &ks, created_unix_ms);
    let ks: Vec<&[u8]> = ks.into_iter().map(|(_, b, _)| b).collect();
    pack_export(&meta, &pbytes, &ks)
}

/// A capture's partition value (this build's format) and its keyspaces as stored.
pub(crate) fn encode_parts(state: &Capture) -> (Vec<u8>, Vec<EncodedKeyspace<'_>>) {
    let pbytes = codec::encode_partition_value(&state.partitions, &state.points);
    let ks = state.keyspaces.iter().map(|k| (k.id.clone(), k.bytes.as_slice(), k.holder_blocks)).collect();
    (pbytes, ks)
}

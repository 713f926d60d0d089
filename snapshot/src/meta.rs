//! A checkpoint's meta: which log and settings it belongs to, the offsets and log times it
//! covers, and the length and checksum of every value — itself checksummed, so a damaged meta
//! is detected before anything else is read.

use crate::codec::{self, DecodeError};
use crate::error::{damaged, Damage, Part, StoreError};
use crate::format::{FORMAT_VERSION, READABLE_FORMATS};
use prefixlog_engine::KeyspaceId;
use prefixlog_state::{LogIdentity, NextOffset, StateSettings};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

pub use crate::checkpoint_meta::{CheckpointMeta, KeyspaceEntry};

/// Keyspace values are stored in chunks of at most this many bytes.
pub(crate) const CHUNK: usize = 4 << 20;

/// A keyspace value's checksum: xxh3-64 over the xxh3-64 of each of its `CHUNK`-sized pieces
/// (little-endian), so the pieces are verified in parallel as they are read.
pub(crate) fn keyspace_checksum(chunk_sums: impl IntoIterator<Item = u64>) -> u64 {
    let sums: Vec<u8> = chunk_sums.into_iter().flat_map(u64::to_le_bytes).collect();
    xxh3_64(&sums)
}

/// A keyspace value's checksum as `format` defines it (format 2: xxh3-64 of the whole value).
pub(crate) fn keyspace_checksum_of(format: u32, bytes: &[u8]) -> u64 {
    keyspace_checksum_with(format, bytes, || bytes.chunks(CHUNK).map(xxh3_64).collect())
}

/// [`keyspace_checksum_of`], given the chunks' checksums when they were already taken (a
/// store read checksums each chunk as it lands).
pub(crate) fn keyspace_checksum_with(
    format: u32,
    bytes: &[u8],
    chunk_sums: impl FnOnce() -> Vec<u64>,
) -> u64 {
    if format >= 3 {
        keyspace_checksum(chunk_sums())
    } else {
        xxh3_64(bytes)
    }
}

/// Checks a keyspace value's length and checksum against its meta entry.
pub(crate) fn verify_keyspace(
    id: u64,
    format: u32,
    e: &KeyspaceEntry,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let part = || Part::Keyspace(e.id.clone());
    if bytes.len() as u64 != e.bytes {
        return Err(damaged(id, part(), Damage::Length { expected: e.bytes, found: bytes.len() as u64 }));
    }
    if keyspace_checksum_of(format, bytes) != e.checksum {
        return Err(damaged(id, part(), Damage::Checksum));
    }
    Ok(())
}

/// A keyspace's image as stored: id, bytes, holder-blocks.
pub(crate) type EncodedKeyspace<'a> = (KeyspaceId, &'a [u8], u64);

impl CheckpointMeta {
    /// This meta as a checkpoint stores it (format, body, checksum).
    pub fn encode(&self) -> Vec<u8> {
        encode_meta(self)
    }

    /// The meta of checkpoint `id` from its stored bytes, checksum, format and contents checked.
    pub fn decode(id: u64, bytes: &[u8]) -> Result<Self, StoreError> {
        decode_meta(id, bytes)
    }

    pub fn holder_blocks(&self) -> u64 {
        self.keyspaces.iter().map(|k| k.holder_blocks).sum()
    }

    /// The newest log time of any covered partition.
    pub fn log_time(&self) -> u64 {
        self.covered().map(|(_, _, t)| t).max().unwrap_or(0)
    }

    /// `(partition, next offset, log time)` of every covered partition.
    pub fn covered(&self) -> impl Iterator<Item = (u32, i64, u64)> + '_ {
        self.identity.owned.iter().map(|&p| (p, self.offsets[p as usize], self.log_times[p as usize]))
    }

    /// Next offset of every covered partition.
    pub fn covered_offsets(&self) -> Vec<NextOffset> {
        self.covered().map(|(p, o, _)| NextOffset::new(p, o)).collect()
    }
}

/// A meta of format 6 on, after its format: the fields in postcard (the identity's settings as
/// their own versioned bytes, which the peer protocol shares: `StateSettings::encode`).
#[derive(Serialize, Deserialize)]
struct MetaRecord {
    id: u64,
    created_unix_ms: u64,
    cluster_id: String,
    topic: String,
    partitions: u32,
    owned: Vec<u32>,
    settings: Vec<u8>,
    offsets: Vec<i64>,
    log_times: Vec<u64>,
    partitions_len: u64,
    partitions_checksum: u64,
    digests: Vec<u64>,
    marks: Vec<u64>,
    keyspaces: Vec<KeyspaceEntry>,
}

impl MetaRecord {
    fn of(m: &CheckpointMeta) -> Self {
        let i = &m.identity;
        MetaRecord {
            id: m.id,
            created_unix_ms: m.created_unix_ms,
            cluster_id: i.cluster_id.clone(),
            topic: i.topic.clone(),
            partitions: i.partitions,
            owned: i.owned.clone(),
            settings: i.settings.encode(),
            offsets: m.offsets.clone(),
            log_times: m.log_times.clone(),
            partitions_len: m.partitions_len,
            partitions_checksum: m.partitions_checksum,
            digests: m.digests.clone(),
            marks: m.marks.clone(),
            keyspaces: m.keyspaces.clone(),
        }
    }

    fn into_meta(self, format: u32, err_id: u64) -> Result<CheckpointMeta, StoreError> {
        let settings = StateSettings::decode(&self.settings)
            .map_err(|what| StoreError::Settings { id: err_id, what })?;
        let (cluster_id, topic, partitions, owned) =
            (self.cluster_id, self.topic, self.partitions, self.owned);
        Ok(CheckpointMeta {
            id: self.id,
            format,
            created_unix_ms: self.created_unix_ms,
            identity: LogIdentity { cluster_id, topic, partitions, owned, settings },
            offsets: self.offsets,
            log_times: self.log_times,
            partitions_len: self.partitions_len,
            partitions_checksum: self.partitions_checksum,
            keyspaces: self.keyspaces,
            digests: self.digests,
            marks: self.marks,
        })
    }
}

/// A meta as stored, in every format: its `u32` format (little-endian), its body (postcard from
/// format 6; hand-laid before, [`crate::upgrade::meta`]), then the xxh3-64 of all before it.
pub(crate) fn encode_meta(m: &CheckpointMeta) -> Vec<u8> {
    let mut buf = m.format.to_le_bytes().to_vec();
    if m.format >= FORMAT_VERSION {
        buf.extend_from_slice(&codec::encode(&MetaRecord::of(m)));
    } else {
        crate::upgrade::meta::put_body(m, &mut buf);
    }
    let sum = xxh3_64(&buf);
    buf.extend_from_slice(&sum.to_le_bytes());
    buf
}

/// The meta of checkpoint `id`, checksum, format and contents checked.
pub(crate) fn decode_meta(id: u64, buf: &[u8]) -> Result<CheckpointMeta, StoreError> {
    let meta = decode_meta_named(id, buf)?;
    if meta.id != id {
        return Err(damaged(id, Part::Meta, Damage::WrongId(meta.id)));
    }
    Ok(meta)
}

/// A meta whatever id it carries (an export's: the exporting store's); `err_id` names the
/// checkpoint in errors until the meta says its id.
pub(crate) fn decode_meta_named(err_id: u64, buf: &[u8]) -> Result<CheckpointMeta, StoreError> {
    let id = err_id;
    if buf.len() < 12 {
        return Err(damaged(id, Part::Meta, Damage::Length { expected: 12, found: buf.len() as u64 }));
    }
    let (body, sum) = buf.split_at(buf.len() - 8);
    if xxh3_64(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err(damaged(id, Part::Meta, Damage::Checksum));
    }
    let (format, body) = body.split_at(4);
    let format = u32::from_le_bytes(format.try_into().expect("4 bytes"));
    if !READABLE_FORMATS.contains(&format) {
        return Err(StoreError::Format { id, found: format });
    }
    let meta = if format >= FORMAT_VERSION {
        codec::decode::<MetaRecord>(body)?.into_meta(format, id)?
    } else {
        crate::upgrade::meta::decode_body(format, body, id)?
    };
    check_counts(&meta)?;
    Ok(meta)
}

/// The covered partitions ascending and in range; one offset, log time and (format 4 on) one
/// record mark per partition of the log.
fn check_counts(m: &CheckpointMeta) -> Result<(), DecodeError> {
    let (owned, partitions) = (&m.identity.owned, m.identity.partitions);
    if owned.iter().any(|&p| p >= partitions) || owned.windows(2).any(|w| w[0] >= w[1]) {
        return Err(DecodeError::CoveredPartitions);
    }
    let marks = if m.format >= 4 { m.marks.len() } else { partitions as usize };
    for (what, found) in
        [("offsets", m.offsets.len()), ("log times", m.log_times.len()), ("record marks", marks)]
    {
        if found != partitions as usize {
            return Err(DecodeError::PerPartitionCount { what, found, partitions });
        }
    }
    Ok(())
}

/// The meta of a checkpoint whose values are `pbytes` and `ks` (each keyspace stored in
/// chunks of at most [`CHUNK`] bytes).
/// Where a state stands, per partition of the log: what a checkpoint's meta records of it.
pub(crate) struct Covered {
    pub offsets: Vec<i64>,
    pub log_times: Vec<u64>,
    pub digests: Vec<u64>,
    pub marks: Vec<u64>,
}

/// What `partitions` (one state per partition of the log) and their `digests` cover.
pub(crate) fn covered(partitions: &[prefixlog_state::PartitionState], digests: &[u64]) -> Covered {
    Covered {
        offsets: partitions.iter().map(|p| p.next_offset).collect(),
        log_times: partitions.iter().map(|p| p.log_time).collect(),
        digests: digests.to_vec(),
        marks: partitions.iter().map(|p| p.last_mark).collect(),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn meta_of(
    id: u64,
    format: u32,
    identity: &LogIdentity,
    covered: Covered,
    pbytes: &[u8],
    ks: &[EncodedKeyspace],
    created_unix_ms: u64,
) -> CheckpointMeta {
    let Covered { offsets, log_times, digests, marks } = covered;
    // A format without fingerprints records none (a format-2 test writer, an imported older one).
    let marks = if format >= 4 { marks } else { Vec::new() };
    CheckpointMeta {
        id,
        format,
        created_unix_ms,
        identity: identity.clone(),
        offsets,
        log_times,
        partitions_len: pbytes.len() as u64,
        partitions_checksum: xxh3_64(pbytes),
        digests,
        marks,
        keyspaces: ks
            .iter()
            .map(|(id, b, hb)| KeyspaceEntry {
                id: id.clone(),
                chunks: b.len().div_ceil(CHUNK) as u32,
                bytes: b.len() as u64,
                checksum: keyspace_checksum_of(format, b),
                holder_blocks: *hb,
            })
            .collect(),
    }
}

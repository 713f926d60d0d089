//! A checkpoint's meta: which log and settings it belongs to, the offsets and log times it
//! covers, and the length and checksum of every value — itself checksummed, so a damaged meta
//! is detected before anything else is read.

use crate::codec::{self, Reader, Writer};
use crate::error::{damaged, Damage, Part, StoreError};
use crate::format::READABLE_FORMATS;
use prefixlog_engine::KeyspaceId;
use prefixlog_state::{LogIdentity, NextOffset, StateSettings};
use xxhash_rust::xxh3::xxh3_64;

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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyspaceEntry {
    pub id: KeyspaceId,
    pub chunks: u32,
    pub bytes: u64,
    pub checksum: u64,
    pub holder_blocks: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointMeta {
    pub id: u64,
    pub format: u32,
    /// Wall-clock creation time: metadata for operators only, never applied state.
    pub created_unix_ms: u64,
    pub identity: LogIdentity,
    /// Next offset to apply, per partition of the log (only covered ones are meaningful).
    pub offsets: Vec<i64>,
    /// Log time applied up to, per partition of the log.
    pub log_times: Vec<u64>,
    pub partitions_len: u64,
    pub partitions_checksum: u64,
    pub keyspaces: Vec<KeyspaceEntry>,
    /// Each partition's digest (holders, feeds, workers) at `offsets`, taken with the state:
    /// what a replay of the log must reproduce (`audit verify`), without rebuilding the state.
    pub digests: Vec<u64>,
    /// Each partition's fingerprint of the record before its offset
    /// ([`prefixlog_state::partition_state::record_mark`], 0 = unknown); empty before format 4.
    pub marks: Vec<u64>,
}

impl CheckpointMeta {
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

pub(crate) fn encode_meta(m: &CheckpointMeta) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(m.format);
    w.u64(m.id);
    w.u64(m.created_unix_ms);
    w.str(&m.identity.cluster_id);
    w.str(&m.identity.topic);
    w.u32(m.identity.partitions);
    w.bytes(&m.identity.settings.encode());
    w.u64(m.identity.owned.len() as u64);
    for &p in &m.identity.owned {
        w.u32(p);
    }
    w.u64(m.offsets.len() as u64);
    for (o, t) in m.offsets.iter().zip(&m.log_times) {
        w.i64(*o);
        w.u64(*t);
    }
    w.u64(m.partitions_len);
    w.u64(m.partitions_checksum);
    w.u64(m.digests.len() as u64);
    for &d in &m.digests {
        w.u64(d);
    }
    if m.format >= 4 {
        w.u64(m.marks.len() as u64);
        for &x in &m.marks {
            w.u64(x);
        }
    }
    w.u64(m.keyspaces.len() as u64);
    for k in &m.keyspaces {
        codec::put_keyspace_id(&mut w, &k.id);
        w.u32(k.chunks);
        w.u64(k.bytes);
        w.u64(k.checksum);
        w.u64(k.holder_blocks);
    }
    let sum = xxh3_64(&w.buf);
    w.u64(sum);
    w.buf
}

pub(crate) fn decode_meta(id: u64, buf: &[u8]) -> Result<CheckpointMeta, StoreError> {
    if buf.len() < 8 {
        return Err(damaged(id, Part::Meta, Damage::Length { expected: 8, found: buf.len() as u64 }));
    }
    let (body, sum) = buf.split_at(buf.len() - 8);
    if xxh3_64(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err(damaged(id, Part::Meta, Damage::Checksum));
    }
    let mut r = Reader::new(body);
    let format = r.u32()?;
    if !READABLE_FORMATS.contains(&format) {
        return Err(StoreError::Format { id, found: format });
    }
    let mid = r.u64()?;
    if mid != id {
        return Err(damaged(id, Part::Meta, Damage::WrongId(mid)));
    }
    let created_unix_ms = r.u64()?;
    let (cluster_id, topic, partitions) = (r.str()?, r.str()?, r.u32()?);
    let settings = StateSettings::decode(r.bytes()?).map_err(|what| StoreError::Settings { id, what })?;
    let n_owned = r.len(4)?;
    let mut owned = Vec::with_capacity(n_owned);
    for _ in 0..n_owned {
        owned.push(r.u32()?);
    }
    if owned.iter().any(|&p| p >= partitions) || owned.windows(2).any(|w| w[0] >= w[1]) {
        return Err(codec::DecodeError::CoveredPartitions.into());
    }
    let identity = LogIdentity { cluster_id, topic, partitions, owned, settings };
    let n = r.len(16)?;
    if n != partitions as usize {
        return Err(codec::DecodeError::PerPartitionCount { what: "offsets", found: n, partitions }.into());
    }
    let (mut offsets, mut log_times) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        offsets.push(r.i64()?);
        log_times.push(r.u64()?);
    }
    let partitions_len = r.u64()?;
    let partitions_checksum = r.u64()?;
    let nd = r.len(8)?;
    let mut digests = Vec::with_capacity(nd);
    for _ in 0..nd {
        digests.push(r.u64()?);
    }
    let mut marks = Vec::new();
    if format >= 4 {
        let nm = r.len(8)?;
        if nm != partitions as usize {
            return Err(codec::DecodeError::PerPartitionCount {
                what: "record marks",
                found: nm,
                partitions,
            }
            .into());
        }
        for _ in 0..nm {
            marks.push(r.u64()?);
        }
    }
    let nk = r.len(36)?;
    let mut keyspaces = Vec::with_capacity(nk);
    for _ in 0..nk {
        keyspaces.push(KeyspaceEntry {
            id: codec::get_keyspace_id(&mut r)?,
            chunks: r.u32()?,
            bytes: r.u64()?,
            checksum: r.u64()?,
            holder_blocks: r.u64()?,
        });
    }
    r.done()?;
    Ok(CheckpointMeta {
        id,
        format,
        created_unix_ms,
        identity,
        offsets,
        log_times,
        partitions_len,
        partitions_checksum,
        keyspaces,
        digests,
        marks,
    })
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

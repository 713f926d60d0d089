//! The checkpoint encoding of metas and partition state: a hand-laid little-endian layout.
//! (Keyspaces are stored as engine images, `prefixlog_engine::persist::image`, which the
//! engine writes and reads itself.)
//!
//! Why not serde + a codec: the values are a few fixed-width fields and short lists, which
//! this writes with no per-item framing. Every read is bounds-checked: a truncated or corrupt
//! value is an `Err`, never a panic (checksums catch corruption before decoding anyway).

use prefixlog_engine::KeyspaceId;
use prefixlog_state::partition_state::{Feed, FeedKey, PartitionCounters, PartitionState};
use prefixlog_state::{BadReason, DigestPoint, LaneMeta};
use std::collections::{BTreeMap, BTreeSet};

/// Why a checkpoint value (a meta, a partition state, a dump) does not decode.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("corrupt checkpoint value: truncated at byte {at} (need {need} more)")]
    Truncated { at: usize, need: usize },
    #[error("corrupt checkpoint value: string is not UTF-8")]
    NotUtf8,
    #[error("corrupt checkpoint value: length {0} exceeds the value")]
    LengthExceedsValue(usize),
    #[error("corrupt checkpoint value: {0} trailing bytes")]
    TrailingBytes(usize),
    #[error("corrupt checkpoint value: unknown bad-record reason {0}")]
    UnknownBadReason(usize),
    #[error("corrupt checkpoint value: covered partitions out of range or unsorted")]
    CoveredPartitions,
    #[error("corrupt checkpoint value: {found} {what} for {partitions} partitions")]
    PerPartitionCount { what: &'static str, found: usize, partitions: u32 },
}

#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.buf.extend_from_slice(s.as_bytes());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.buf.extend_from_slice(b);
    }
}

pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(DecodeError::Truncated { at: self.pos, need: n })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub fn str(&mut self) -> Result<String, DecodeError> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| DecodeError::NotUtf8)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u64()? as usize;
        self.take(n)
    }
    /// A length prefix, sanity-checked against the bytes left (each item needs ≥ `min` bytes).
    pub fn len(&mut self, min: usize) -> Result<usize, DecodeError> {
        let n = self.u64()? as usize;
        if n.saturating_mul(min.max(1)) > self.buf.len() - self.pos {
            return Err(DecodeError::LengthExceedsValue(n));
        }
        Ok(n)
    }
    pub fn done(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.buf.len() - self.pos))
        }
    }
}

pub fn put_keyspace_id(w: &mut Writer, id: &KeyspaceId) {
    w.str(&id.model);
    w.u32(id.block_size);
    w.u32(id.scheme);
}

pub fn get_keyspace_id(r: &mut Reader) -> Result<KeyspaceId, DecodeError> {
    Ok(KeyspaceId::new(r.str()?, r.u32()?, r.u32()?))
}

/// Encodes every partition's applier state (formats 2 to 4: the whole partition value).
pub fn encode_partitions(parts: &[PartitionState]) -> Vec<u8> {
    let mut w = Writer::default();
    put_partitions(&mut w, parts);
    w.buf
}

/// The partition value of format 5 on: every partition's applier state, then every
/// partition's recorded digest points (not applied state: how far back anti-entropy can
/// compare, kept so that a restart does not forget it).
pub fn encode_partitions_and_points(parts: &[PartitionState], points: &[Vec<DigestPoint>]) -> Vec<u8> {
    let mut w = Writer::default();
    put_partitions(&mut w, parts);
    w.u64(points.len() as u64);
    for list in points {
        w.u64(list.len() as u64);
        for d in list {
            w.i64(d.next_offset);
            w.u64(d.log_time);
            w.u64(d.digest);
        }
    }
    w.buf
}

/// Decodes a partition value of checkpoint format `format`: partition states, and the digest
/// points from format 5 on (none before).
pub fn decode_partition_value(
    buf: &[u8],
    format: u32,
) -> Result<(Vec<PartitionState>, Vec<Vec<DigestPoint>>), DecodeError> {
    let mut r = Reader::new(buf);
    let parts = read_partitions(&mut r)?;
    let mut points = Vec::new();
    if format >= 5 {
        let n = r.len(8)?;
        for _ in 0..n {
            let m = r.len(24)?;
            let mut list = Vec::with_capacity(m);
            for _ in 0..m {
                list.push(DigestPoint { next_offset: r.i64()?, log_time: r.u64()?, digest: r.u64()? });
            }
            points.push(list);
        }
    }
    r.done()?;
    Ok((parts, points))
}

fn put_partitions(w: &mut Writer, parts: &[PartitionState]) {
    w.u64(parts.len() as u64);
    for p in parts {
        w.i64(p.next_offset);
        w.u64(p.log_time);
        w.u64(p.expiry_bucket);
        for v in counter_fields(&p.counters) {
            w.u64(v);
        }
        w.u64(p.counters.bad.len() as u64);
        for (reason, n) in &p.counters.bad {
            w.u8(BadReason::ALL.iter().position(|r| r == reason).expect("known reason") as u8);
            w.u64(*n);
        }
        w.u64(p.feeds.len() as u64);
        for (k, f) in &p.feeds {
            put_keyspace_id(w, &k.keyspace);
            w.u64(k.worker);
            w.u32(k.dp_rank);
            w.u64(f.epoch);
            w.u8(u8::from(f.last_seq.is_some()) | (u8::from(f.gapped) << 1));
            w.u64(f.last_seq.unwrap_or(0));
            w.u64(f.lanes.len() as u64);
            for &l in &f.lanes {
                w.u32(l);
            }
            w.u64(f.lane_meta.len() as u64);
            for m in f.lane_meta.values() {
                w.u32(m.lane);
                w.str(&m.kind);
                w.u32(m.sliding_window);
                w.u32(m.block_size);
            }
        }
        w.u64(p.workers.len() as u64);
        for (worker, meta) in &p.workers {
            w.u64(*worker);
            w.u64(meta.len() as u64);
            for (k, v) in meta {
                w.str(k);
                w.str(v);
            }
        }
    }
}

/// The fixed-width counters, in encoding order.
fn counter_fields(c: &PartitionCounters) -> [u64; 9] {
    [
        c.applied,
        c.duplicates,
        c.stale_epochs,
        c.gaps,
        c.epochs,
        c.missing_parents,
        c.invalid_stores,
        c.log_time_clamped,
        c.log_gaps,
    ]
}

/// Decodes a partition value of formats 2 to 4 ([`encode_partitions`]).
pub fn decode_partitions(buf: &[u8]) -> Result<Vec<PartitionState>, DecodeError> {
    let mut r = Reader::new(buf);
    let out = read_partitions(&mut r)?;
    r.done()?;
    Ok(out)
}

fn read_partitions(r: &mut Reader) -> Result<Vec<PartitionState>, DecodeError> {
    let n = r.len(8)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut p = PartitionState {
            next_offset: r.i64()?,
            log_time: r.u64()?,
            expiry_bucket: r.u64()?,
            ..Default::default()
        };
        let mut c = PartitionCounters::default();
        for v in [
            &mut c.applied,
            &mut c.duplicates,
            &mut c.stale_epochs,
            &mut c.gaps,
            &mut c.epochs,
            &mut c.missing_parents,
            &mut c.invalid_stores,
            &mut c.log_time_clamped,
            &mut c.log_gaps,
        ] {
            *v = r.u64()?;
        }
        let nb = r.len(9)?;
        let mut bad = BTreeMap::new();
        for _ in 0..nb {
            let i = r.u8()? as usize;
            let reason = *BadReason::ALL.get(i).ok_or(DecodeError::UnknownBadReason(i))?;
            bad.insert(reason, r.u64()?);
        }
        c.bad = bad;
        p.counters = c;
        let nf = r.len(20)?;
        for _ in 0..nf {
            let keyspace = get_keyspace_id(r)?;
            let key = FeedKey { keyspace, worker: r.u64()?, dp_rank: r.u32()? };
            let epoch = r.u64()?;
            let flags = r.u8()?;
            let seq = r.u64()?;
            let nl = r.len(4)?;
            let mut lanes = BTreeSet::new();
            for _ in 0..nl {
                lanes.insert(r.u32()?);
            }
            let nm = r.len(16)?;
            let mut lane_meta = BTreeMap::new();
            for _ in 0..nm {
                let m = LaneMeta {
                    lane: r.u32()?,
                    kind: r.str()?,
                    sliding_window: r.u32()?,
                    block_size: r.u32()?,
                };
                lane_meta.insert(m.lane, m);
            }
            let last_seq = (flags & 1 != 0).then_some(seq);
            p.feeds.insert(key, Feed { epoch, last_seq, lanes, gapped: flags & 2 != 0, lane_meta });
        }
        let nw = r.len(16)?;
        for _ in 0..nw {
            let worker = r.u64()?;
            let nm = r.len(8)?;
            let mut meta = BTreeMap::new();
            for _ in 0..nm {
                meta.insert(r.str()?, r.str()?);
            }
            p.workers.insert(worker, meta);
        }
        out.push(p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_values_fail_with_what_is_wrong() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u32(), Err(DecodeError::Truncated { at: 0, need: 4 }));
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.done(), Err(DecodeError::TrailingBytes(2)));
        let mut w = Writer::default();
        w.u64(1_000);
        assert_eq!(Reader::new(&w.buf).len(1), Err(DecodeError::LengthExceedsValue(1_000)));
        let mut w = Writer::default();
        w.u32(2);
        w.buf.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(Reader::new(&w.buf).str(), Err(DecodeError::NotUtf8));
    }
}

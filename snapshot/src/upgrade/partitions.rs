//! Partition values of formats 2 to 5: each partition's applier state field by field
//! (counters, bad-record reasons by their place in `BadReason::ALL`, feeds, lanes, workers),
//! then, from format 5, every partition's digest points. The encoders remain for the tests that
//! write those formats, as an older release did.

use super::layout::{get_keyspace_id, Reader};
#[cfg(any(test, feature = "testing"))]
use super::layout::{put_keyspace_id, Writer};
use crate::decode_error::DecodeError;
use prefixlog_state::partition_state::{Feed, FeedKey, PartitionCounters, PartitionState};
use prefixlog_state::{BadReason, DigestPoint, LaneMeta};
use std::collections::{BTreeMap, BTreeSet};

/// Encodes every partition's applier state (formats 2 to 4: the whole partition value).
#[cfg(any(test, feature = "testing"))]
pub fn encode_partitions(parts: &[PartitionState]) -> Vec<u8> {
    let mut w = Writer::default();
    put_partitions(&mut w, parts);
    w.buf
}

/// The partition value of format 5: every partition's applier state, then every partition's
/// recorded digest points.
#[cfg(any(test, feature = "testing"))]
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

/// Decodes a partition value of checkpoint format `format` (2 to 5): partition states, and the
/// digest points from format 5 on (none before).
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

#[cfg(any(test, feature = "testing"))]
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
#[cfg(any(test, feature = "testing"))]
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

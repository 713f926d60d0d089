//! The checkpoint encoding: a hand-laid, column-oriented little-endian layout.
//!
//! Why not serde + a codec: the state is a few large arrays of fixed-width integers (node
//! parents and locals, holder memberships), which a columnar layout writes with no per-item
//! framing and reads with no allocation per item. RocksDB compresses the values (LZ4), which
//! removes most of the fixed-width slack. Every read is bounds-checked: a truncated or corrupt
//! value is an `Err`, never a panic (checksums catch corruption before decoding anyway).

use prefixlog_engine::{DumpHolder, DumpNode, HolderKey, KeyspaceDump, KeyspaceId, KeyspaceStats};
use prefixlog_ingest::partition_state::{Feed, FeedKey, PartitionCounters, PartitionState};
use prefixlog_ingest::{BadReason, LaneMeta};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, thiserror::Error)]
#[error("corrupt checkpoint value: {0}")]
pub struct DecodeError(pub String);

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
        let end =
            end.ok_or_else(|| DecodeError(format!("truncated at byte {} (need {n} more)", self.pos)))?;
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
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| DecodeError("string is not UTF-8".into()))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u64()? as usize;
        self.take(n)
    }
    /// A length prefix, sanity-checked against the bytes left (each item needs ≥ `min` bytes).
    pub fn len(&mut self, min: usize) -> Result<usize, DecodeError> {
        let n = self.u64()? as usize;
        if n.saturating_mul(min.max(1)) > self.buf.len() - self.pos {
            return Err(DecodeError(format!("length {n} exceeds the value")));
        }
        Ok(n)
    }
    pub fn done(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(DecodeError(format!("{} trailing bytes", self.buf.len() - self.pos)))
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

fn stats_fields(s: &KeyspaceStats) -> [u64; 7] {
    [
        s.blocks_stored,
        s.blocks_removed,
        s.removes_unknown,
        s.stores_rejected,
        s.placements_ignored,
        s.evicted_capacity,
        s.expired_ttl,
    ]
}

/// Encodes a keyspace: columns of nodes, then holders.
pub fn encode_keyspace(d: &KeyspaceDump) -> Vec<u8> {
    let mut w =
        Writer { buf: Vec::with_capacity(d.nodes.len() * 21 + d.holder_blocks() as usize * 8 + 1024) };
    put_keyspace_id(&mut w, &d.id);
    for v in stats_fields(&d.stats) {
        w.u64(v);
    }
    w.u64(d.nodes.len() as u64);
    for n in &d.nodes {
        w.u32(n.parent);
    }
    for n in &d.nodes {
        w.u64(n.local);
    }
    for n in &d.nodes {
        w.u8(u8::from(n.ext.is_some()));
    }
    for n in &d.nodes {
        if let Some(e) = n.ext {
            w.u64(e);
        }
    }
    w.u64(d.holders.len() as u64);
    for h in &d.holders {
        w.u64(h.key.worker);
        w.u32(h.key.dp_rank);
        w.u32(h.key.lane);
        w.u8(u8::from(h.fed) | (u8::from(h.gapped) << 1));
        w.u32(h.next_stamp);
        w.u64(h.last_time);
        w.u64(h.records.len() as u64);
        for &(stamp, leaf, len, time) in &h.records {
            w.u32(stamp);
            w.u32(leaf);
            w.u32(len);
            w.u64(time);
        }
        w.u64(h.members.len() as u64);
        for &(node, _) in &h.members {
            w.u32(node);
        }
        for &(_, stamp) in &h.members {
            w.u32(stamp);
        }
        w.u64(h.overrides.len() as u64);
        for &(ext, node) in &h.overrides {
            w.u64(ext);
            w.u32(node);
        }
    }
    w.buf
}

pub fn decode_keyspace(buf: &[u8]) -> Result<KeyspaceDump, DecodeError> {
    let mut r = Reader::new(buf);
    let id = get_keyspace_id(&mut r)?;
    let mut f = [0u64; 7];
    for v in &mut f {
        *v = r.u64()?;
    }
    let stats = KeyspaceStats {
        blocks_stored: f[0],
        blocks_removed: f[1],
        removes_unknown: f[2],
        stores_rejected: f[3],
        placements_ignored: f[4],
        evicted_capacity: f[5],
        expired_ttl: f[6],
    };
    let n = r.len(13)?;
    let mut nodes: Vec<DumpNode> = Vec::with_capacity(n);
    for _ in 0..n {
        nodes.push(DumpNode { parent: r.u32()?, local: 0, ext: None });
    }
    for node in &mut nodes {
        node.local = r.u64()?;
    }
    let mut has = Vec::with_capacity(n);
    for _ in 0..n {
        has.push(r.u8()? != 0);
    }
    for (node, h) in nodes.iter_mut().zip(has) {
        if h {
            node.ext = Some(r.u64()?);
        }
    }
    let nh = r.len(37)?;
    let mut holders = Vec::with_capacity(nh);
    for _ in 0..nh {
        let key = HolderKey::new(r.u64()?, r.u32()?, r.u32()?);
        let flags = r.u8()?;
        let next_stamp = r.u32()?;
        let last_time = r.u64()?;
        let nr = r.len(20)?;
        let mut records = Vec::with_capacity(nr);
        for _ in 0..nr {
            records.push((r.u32()?, r.u32()?, r.u32()?, r.u64()?));
        }
        let nm = r.len(8)?;
        let mut members: Vec<(u32, u32)> = Vec::with_capacity(nm);
        for _ in 0..nm {
            members.push((r.u32()?, 0));
        }
        for m in &mut members {
            m.1 = r.u32()?;
        }
        let no = r.len(12)?;
        let mut overrides = Vec::with_capacity(no);
        for _ in 0..no {
            overrides.push((r.u64()?, r.u32()?));
        }
        holders.push(DumpHolder {
            key,
            fed: flags & 1 != 0,
            gapped: flags & 2 != 0,
            next_stamp,
            last_time,
            records,
            members,
            overrides,
        });
    }
    r.done()?;
    Ok(KeyspaceDump { id, nodes, holders, stats })
}

/// Encodes every partition's applier state.
pub fn encode_partitions(parts: &[PartitionState]) -> Vec<u8> {
    let mut w = Writer::default();
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
            put_keyspace_id(&mut w, &k.keyspace);
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
    w.buf
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

pub fn decode_partitions(buf: &[u8]) -> Result<Vec<PartitionState>, DecodeError> {
    let mut r = Reader::new(buf);
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
            let reason = *BadReason::ALL
                .get(i)
                .ok_or_else(|| DecodeError(format!("unknown bad-record reason {i}")))?;
            bad.insert(reason, r.u64()?);
        }
        c.bad = bad;
        p.counters = c;
        let nf = r.len(20)?;
        for _ in 0..nf {
            let keyspace = get_keyspace_id(&mut r)?;
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
    r.done()?;
    Ok(out)
}

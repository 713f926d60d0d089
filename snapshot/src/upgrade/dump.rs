//! Format-2 keyspace values: columnar dumps (node parents, locals and ext hashes as arrays,
//! then per-holder records and memberships), rebuilt node by node on restore. Format 3 stores
//! engine images instead; this is kept so that a replica upgraded from format 2 still restores
//! its checkpoints (and a peer's) instead of needing the whole log. New checkpoints are never
//! written in it (the encoder exists for the upgrade test).

use super::layout::{get_keyspace_id, put_keyspace_id, Reader, Writer};
use crate::decode_error::DecodeError;
use prefixlog_engine::{DumpHolder, DumpNode, HolderKey, KeyspaceDump, KeyspaceStats};

/// Encodes a keyspace: columns of nodes, then holders.
pub fn encode_keyspace(d: &KeyspaceDump) -> Vec<u8> {
    let mut w =
        Writer { buf: Vec::with_capacity(d.nodes.len() * 21 + d.holder_blocks() as usize * 8 + 1024) };
    put_keyspace_id(&mut w, &d.id);
    for v in d.stats.to_fields() {
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
    let stats = KeyspaceStats::from_fields(f);
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

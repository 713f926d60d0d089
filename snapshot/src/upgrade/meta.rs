//! Metas of formats 2 to 5, after their `u32` format: id, creation time, identity (the settings
//! as their own versioned bytes), offsets and log times interleaved, the partition value's
//! length and checksum, digests, record marks (format 4 on), keyspace entries. Still written to
//! pass an older checkpoint on as it was stored: an export and an import keep its format.

use super::layout::{get_keyspace_id, put_keyspace_id, Reader, Writer};
use crate::checkpoint_meta::{CheckpointMeta, KeyspaceEntry};
use crate::error::StoreError;
use prefixlog_state::{LogIdentity, StateSettings};

/// Appends everything after the format and before the checksum.
pub(crate) fn put_body(m: &CheckpointMeta, buf: &mut Vec<u8>) {
    let mut w = Writer { buf: std::mem::take(buf) };
    w.u64(m.id);
    w.u64(m.created_unix_ms);
    w.str(&m.identity.cluster_id);
    w.str(&m.identity.topic);
    w.u32(m.identity.partitions);
    w.bytes(&m.identity.settings.encode());
    put_u32s(&mut w, &m.identity.owned);
    w.u64(m.offsets.len() as u64);
    for (o, t) in m.offsets.iter().zip(&m.log_times) {
        w.i64(*o);
        w.u64(*t);
    }
    w.u64(m.partitions_len);
    w.u64(m.partitions_checksum);
    put_u64s(&mut w, &m.digests);
    if m.format >= 4 {
        put_u64s(&mut w, &m.marks);
    }
    w.u64(m.keyspaces.len() as u64);
    for k in &m.keyspaces {
        put_keyspace_id(&mut w, &k.id);
        w.u32(k.chunks);
        w.u64(k.bytes);
        w.u64(k.checksum);
        w.u64(k.holder_blocks);
    }
    *buf = w.buf;
}

fn put_u32s(w: &mut Writer, v: &[u32]) {
    w.u64(v.len() as u64);
    v.iter().for_each(|&x| w.u32(x));
}

fn put_u64s(w: &mut Writer, v: &[u64]) {
    w.u64(v.len() as u64);
    v.iter().for_each(|&x| w.u64(x));
}

/// Decodes the body [`put_body`] wrote; `err_id` names the checkpoint in errors.
pub(crate) fn decode_body(format: u32, body: &[u8], err_id: u64) -> Result<CheckpointMeta, StoreError> {
    let mut r = Reader::new(body);
    let id = r.u64()?;
    let created_unix_ms = r.u64()?;
    let (cluster_id, topic, partitions) = (r.str()?, r.str()?, r.u32()?);
    let settings =
        StateSettings::decode(r.bytes()?).map_err(|what| StoreError::Settings { id: err_id, what })?;
    let owned = read_list(&mut r, 4, Reader::u32)?;
    let identity = LogIdentity { cluster_id, topic, partitions, owned, settings };
    let n = r.len(16)?;
    let (mut offsets, mut log_times) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        offsets.push(r.i64()?);
        log_times.push(r.u64()?);
    }
    let partitions_len = r.u64()?;
    let partitions_checksum = r.u64()?;
    let digests = read_list(&mut r, 8, Reader::u64)?;
    let marks = if format >= 4 { read_list(&mut r, 8, Reader::u64)? } else { Vec::new() };
    let keyspaces = read_list(&mut r, 36, |r| {
        Ok(KeyspaceEntry {
            id: get_keyspace_id(r)?,
            chunks: r.u32()?,
            bytes: r.u64()?,
            checksum: r.u64()?,
            holder_blocks: r.u64()?,
        })
    })?;
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

/// A `u64`-length list of items of at least `min` bytes each.
fn read_list<'a, T>(
    r: &mut Reader<'a>,
    min: usize,
    item: impl Fn(&mut Reader<'a>) -> Result<T, crate::decode_error::DecodeError>,
) -> Result<Vec<T>, crate::decode_error::DecodeError> {
    let n = r.len(min)?;
    (0..n).map(|_| item(r)).collect()
}

//! Appending hand-built record batches with a plain Kafka Produce request (v3, record batch
//! format v2): what a broker writes for a transaction — its end marker, a control batch — which
//! no client API produces, and which neither test broker writes for a transactional producer
//! (the embedded broker's EndTxn only answers; tansu 0.6 does not implement EndTxn).
//!
//! Written from the protocol's public definition (Apache Kafka, "A Guide To The Kafka Protocol"
//! and `RecordBatch` in its message format docs, Apache-2.0); only what the tests need: one
//! partition per request, no compression, `acks=-1`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Batch attribute bits (record batch v2).
const TRANSACTIONAL: i16 = 0x10;
const CONTROL: i16 = 0x20;

/// A record's key and value.
type KeyValue<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// The type of a transaction marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    Abort = 0,
    Commit = 1,
}

/// CRC-32C (Castagnoli), bit by bit: the batches here are tiny.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

fn varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn bytes_field(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => varint(out, -1),
        Some(b) => {
            varint(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

/// A record batch (v2) of `records` (key, value), all at `timestamp_ms`.
fn batch(attributes: i16, producer: (i64, i16, i32), timestamp_ms: i64, records: &[KeyValue]) -> Vec<u8> {
    let mut body = Vec::new(); // from attributes on: what the CRC covers
    body.extend_from_slice(&attributes.to_be_bytes());
    body.extend_from_slice(&(records.len() as i32 - 1).to_be_bytes()); // lastOffsetDelta
    body.extend_from_slice(&timestamp_ms.to_be_bytes()); // baseTimestamp
    body.extend_from_slice(&timestamp_ms.to_be_bytes()); // maxTimestamp
    body.extend_from_slice(&producer.0.to_be_bytes());
    body.extend_from_slice(&producer.1.to_be_bytes());
    body.extend_from_slice(&producer.2.to_be_bytes()); // baseSequence
    body.extend_from_slice(&(records.len() as i32).to_be_bytes());
    for (i, (k, v)) in records.iter().enumerate() {
        let mut r = vec![0u8]; // attributes
        varint(&mut r, 0); // timestampDelta
        varint(&mut r, i as i64); // offsetDelta
        bytes_field(&mut r, *k);
        bytes_field(&mut r, *v);
        varint(&mut r, 0); // headers
        varint(&mut body, r.len() as i64);
        body.extend_from_slice(&r);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&0i64.to_be_bytes()); // baseOffset (the broker assigns it)
    let len = 4 + 1 + 4 + body.len(); // partitionLeaderEpoch, magic, crc, body
    out.extend_from_slice(&(len as i32).to_be_bytes());
    out.extend_from_slice(&(-1i32).to_be_bytes()); // partitionLeaderEpoch
    out.push(2); // magic
    out.extend_from_slice(&crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A transaction's end marker for `producer` (id, epoch): a control batch of one control record.
pub fn marker_batch(marker: Marker, producer: (i64, i16), timestamp_ms: i64) -> Vec<u8> {
    let key = [0u8, 0, 0, marker as u8]; // version 0, type
    let value = [0u8, 0, 0, 0, 0, 0]; // version 0, coordinator epoch 0
    batch(TRANSACTIONAL | CONTROL, (producer.0, producer.1, -1), timestamp_ms, &[(Some(&key), Some(&value))])
}

/// `values` (keyed by `key`) as records of a transaction of `producer` (id, epoch).
pub fn transactional_batch(
    producer: (i64, i16),
    key: &[u8],
    values: &[Vec<u8>],
    timestamp_ms: i64,
) -> Vec<u8> {
    let records: Vec<KeyValue> = values.iter().map(|v| (Some(key), Some(&v[..]))).collect();
    batch(TRANSACTIONAL, (producer.0, producer.1, 0), timestamp_ms, &records)
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as i16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Appends `batch` to `topic`/`partition` on the broker at `addr` (the partition's leader: the
/// single broker of a test setup); returns the offset it was written at.
pub fn produce(addr: &str, topic: &str, partition: i32, batch: &[u8]) -> std::io::Result<i64> {
    let mut req = Vec::new();
    req.extend_from_slice(&0i16.to_be_bytes()); // api key: Produce
    req.extend_from_slice(&3i16.to_be_bytes()); // version
    req.extend_from_slice(&7i32.to_be_bytes()); // correlation id
    string(&mut req, "prefixlog-tests");
    req.extend_from_slice(&(-1i16).to_be_bytes()); // transactional id: null
    req.extend_from_slice(&(-1i16).to_be_bytes()); // acks: all
    req.extend_from_slice(&10_000i32.to_be_bytes()); // timeout
    req.extend_from_slice(&1i32.to_be_bytes()); // topics
    string(&mut req, topic);
    req.extend_from_slice(&1i32.to_be_bytes()); // partitions
    req.extend_from_slice(&partition.to_be_bytes());
    req.extend_from_slice(&(batch.len() as i32).to_be_bytes());
    req.extend_from_slice(batch);

    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(&(req.len() as i32).to_be_bytes())?;
    s.write_all(&req)?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut resp = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut resp)?;
    // correlation id, topics (1), name, partitions (1), index, error code, base offset, ...
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "short Produce response");
    let mut at = 4 + 4;
    let name_len = i16::from_be_bytes(resp.get(at..at + 2).ok_or_else(bad)?.try_into().unwrap()) as usize;
    at += 2 + name_len + 4 + 4;
    let code = i16::from_be_bytes(resp.get(at..at + 2).ok_or_else(bad)?.try_into().unwrap());
    let offset = i64::from_be_bytes(resp.get(at + 2..at + 10).ok_or_else(bad)?.try_into().unwrap());
    if code != 0 {
        return Err(std::io::Error::other(format!("Produce refused: error code {code}")));
    }
    Ok(offset)
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32c_check_value() {
        assert_eq!(super::crc32c(b"123456789"), 0xE306_9283);
    }
}

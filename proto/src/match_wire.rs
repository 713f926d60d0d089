//! `MatchResponse` on the wire without prost's per-message overhead for its score list: the
//! same bytes as prost, written and read by hand for field 1 (`scores`), by prost for the rest.
//!
//! Why: an answer that lists every worker carries hundreds of `WorkerScore`s, small nested
//! messages of a few varints each. prost encodes each one by computing its length twice (once
//! for the whole message's size, once for the score's length prefix) and decodes each through
//! its generic field dispatch, pushing into a score list grown one doubling at a time. For
//! `bench-query`'s 256-score answers that was ~10 µs to encode and ~10 µs to decode per call,
//! more than the engine's match, on every Match a gateway makes.
//!
//! The rules that keep this exact:
//! - Encoding writes what prost writes: scores first (field 1 is the lowest field number, and
//!   prost writes fields in number order), each score's fields in number order, default values
//!   left out; then prost encodes the message without its scores and that is appended.
//! - Decoding takes the fast path only for what it fully understands: a score whose fields are
//!   the eight known ones with their own wire types. A score with anything else (an unknown
//!   field from a newer server, say) is decoded by prost alone; a message the skim cannot walk
//!   (bad lengths, groups) is decoded by prost whole, so a malformed message fails with prost's
//!   own error. Every other field is decoded by prost from its original bytes, in order.
//! - `proto/tests/match_wire.rs` compares both directions with prost on seeded random messages
//!   and on mutations of their bytes (unknown fields, duplicates, truncation, noise).

use crate::v1::{Interval, MatchResponse, WorkerScore};
use prost::encoding::encode_varint;
use prost::{DecodeError, Message};

/// Key of `MatchResponse.scores` (field 1, length-delimited).
const SCORES_KEY: u8 = 0x0a;
/// Keys of `WorkerScore`'s fields (number << 3 | wire type), all one byte.
const WORKER: u8 = 0x08;
const DP_RANK: u8 = 0x10;
const LANE: u8 = 0x18;
const DEPTH: u8 = 0x20;
const TOTAL_BLOCKS: u8 = 0x28;
const INFERRED: u8 = 0x30;
const INTERVALS: u8 = 0x3a;
const GAPPED: u8 = 0x40;

/// Most bytes a score without intervals takes: five varint fields (a u64 in at most 10 bytes,
/// a u32 in at most 5) and two bools, each with its one-byte key. Under 128, so such a score's
/// length prefix is one byte.
const MAX_PLAIN_SCORE: usize = (1 + 10) + 4 * (1 + 5) + 2 * 2;
const _: () = assert!(MAX_PLAIN_SCORE < 128);

fn put_varint_field(out: &mut Vec<u8>, key: u8, v: u64) {
    if v != 0 {
        out.push(key);
        encode_varint(v, out);
    }
}

/// One score with its key and length prefix. Without intervals the body is written first and
/// its one-byte length filled in after; with them prost computes the length first.
fn put_score(out: &mut Vec<u8>, s: &WorkerScore) {
    out.push(SCORES_KEY);
    let len_at = out.len();
    if s.intervals.is_empty() {
        out.push(0);
    } else {
        encode_varint(s.encoded_len() as u64, out);
    }
    let body_at = out.len();
    put_varint_field(out, WORKER, s.worker);
    put_varint_field(out, DP_RANK, s.dp_rank.into());
    put_varint_field(out, LANE, s.lane.into());
    put_varint_field(out, DEPTH, s.depth.into());
    put_varint_field(out, TOTAL_BLOCKS, s.total_blocks.into());
    put_varint_field(out, INFERRED, s.inferred.into());
    for i in &s.intervals {
        out.push(INTERVALS);
        encode_varint(i.encoded_len() as u64, out);
        i.encode_raw(out);
    }
    put_varint_field(out, GAPPED, s.gapped.into());
    if s.intervals.is_empty() {
        let len = out.len() - body_at;
        debug_assert!(len <= MAX_PLAIN_SCORE);
        out[len_at] = len as u8;
    }
}

/// `r` encoded, byte for byte what `r.encode_to_vec()` gives.
pub fn encode(mut r: MatchResponse) -> Vec<u8> {
    let scores = std::mem::take(&mut r.scores);
    let plain = 2 + MAX_PLAIN_SCORE;
    let mut out = Vec::with_capacity(scores.len() * plain + r.encoded_len());
    for s in &scores {
        put_score(&mut out, s);
    }
    r.encode_raw(&mut out);
    out
}

/// `bytes` decoded as prost would: the same message, or prost's error.
pub fn decode(bytes: &[u8]) -> Result<MatchResponse, DecodeError> {
    match skim(bytes) {
        Some(r) => Ok(r),
        None => MatchResponse::decode(bytes),
    }
}

/// Walks the top-level fields: scores are decoded here, every other field's bytes are kept
/// for prost. `None` when the walk fails (prost then decodes the whole message).
fn skim(bytes: &[u8]) -> Option<MatchResponse> {
    let mut scores = Vec::with_capacity(count_scores(bytes));
    let mut rest = Vec::new();
    let mut buf = bytes;
    while !buf.is_empty() {
        let field_start = buf;
        let key = varint(&mut buf)?;
        match key & 7 {
            0 => {
                varint(&mut buf)?;
            }
            1 => buf = buf.get(8..)?,
            2 => {
                let len = usize::try_from(varint(&mut buf)?).ok()?;
                let (body, tail) = (buf.get(..len)?, buf.get(len..)?);
                buf = tail;
                if key == u64::from(SCORES_KEY) {
                    scores.push(WorkerScore::default());
                    let last = scores.last_mut()?;
                    if !fill_score(last, body) {
                        *last = WorkerScore::decode(body).ok()?;
                    }
                    continue;
                }
            }
            5 => buf = buf.get(4..)?,
            _ => return None,
        }
        rest.extend_from_slice(&field_start[..field_start.len() - buf.len()]);
    }
    let mut r =
        if rest.is_empty() { MatchResponse::default() } else { MatchResponse::decode(&rest[..]).ok()? };
    // `rest` holds no field-1 entry with a length-delimited wire type, so prost left `scores`
    // empty (any other wire type for field 1 is prost's error, and we fell back above).
    r.scores = scores;
    Some(r)
}

/// How many top-level field-1 entries `bytes` has, to size the score list once; stops early
/// on anything it cannot walk (the list then grows as usual).
fn count_scores(bytes: &[u8]) -> usize {
    let mut n = 0;
    let mut buf = bytes;
    while let Some((&SCORES_KEY, tail)) = buf.split_first() {
        let mut tail = tail;
        let Some(len) = varint(&mut tail).and_then(|l| usize::try_from(l).ok()) else {
            break;
        };
        let Some(next) = tail.get(len..) else { break };
        buf = next;
        n += 1;
    }
    n
}

/// Reads one score's body into `s` (a default score); `false` when it holds anything but the
/// known fields with their own wire types, or does not parse (prost then decodes it).
fn fill_score(s: &mut WorkerScore, body: &[u8]) -> bool {
    let mut buf = body;
    while let Some((&key, tail)) = buf.split_first() {
        buf = tail;
        if key == INTERVALS {
            match interval(&mut buf) {
                Some(i) => s.intervals.push(i),
                None => return false,
            }
            continue;
        }
        let Some(v) = varint(&mut buf) else { return false };
        match key {
            WORKER => s.worker = v,
            // uint32 and bool from a varint as prost reads them: truncated, and non-zero.
            DP_RANK => s.dp_rank = v as u32,
            LANE => s.lane = v as u32,
            DEPTH => s.depth = v as u32,
            TOTAL_BLOCKS => s.total_blocks = v as u32,
            INFERRED => s.inferred = v != 0,
            GAPPED => s.gapped = v != 0,
            _ => return false,
        }
    }
    true
}

/// A length-delimited `Interval`, decoded by prost (rare: only answers that ask for intervals).
fn interval(buf: &mut &[u8]) -> Option<Interval> {
    let len = usize::try_from(varint(buf)?).ok()?;
    let i = Interval::decode(buf.get(..len)?).ok()?;
    *buf = buf.get(len..)?;
    Some(i)
}

/// A varint read from a slice, as prost reads it: at most ten bytes, the tenth at most 1.
/// Written out because prost's `decode_varint` (generic over `Buf`) made the decode ~20%
/// slower here (`match-codec-bench`: 7.5–8.4 against 6.0–6.3 µs).
#[inline]
fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for (i, &b) in buf.iter().take(10).enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            if i == 9 && b > 1 {
                return None;
            }
            *buf = &buf[i + 1..];
            return Some(v);
        }
    }
    None
}

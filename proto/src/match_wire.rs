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

/// A score's body without intervals, built on the stack and appended in one copy (pushing
/// byte by byte into the `Vec` checked its capacity at every byte).
struct PlainScore {
    bytes: [u8; MAX_PLAIN_SCORE],
    len: usize,
}

impl PlainScore {
    fn new() -> Self {
        Self { bytes: [0; MAX_PLAIN_SCORE], len: 0 }
    }

    /// A varint field, left out when 0 (proto3 default), as prost writes it.
    #[inline(always)]
    fn field(&mut self, key: u8, mut v: u64) {
        if v == 0 {
            return;
        }
        self.bytes[self.len] = key;
        self.len += 1;
        while v >= 0x80 {
            self.bytes[self.len] = v as u8 | 0x80;
            self.len += 1;
            v >>= 7;
        }
        self.bytes[self.len] = v as u8;
        self.len += 1;
    }
}

/// One score with its key and length prefix: its fields in number order, the varint ones
/// through a stack buffer. Without intervals the body is that buffer alone (under 128 bytes, a
/// one-byte length prefix); with them prost computes the length first.
fn put_score(out: &mut Vec<u8>, s: &WorkerScore) {
    if !s.tiers.is_empty() || !s.runs.is_empty() || s.weighted_score != 0 {
        // Tiered answers (fields 9-11) are prost's: rarer, and their bytes its to decide.
        out.push(SCORES_KEY);
        encode_varint(s.encoded_len() as u64, out);
        s.encode_raw(out);
        return;
    }
    let mut b = PlainScore::new();
    b.field(WORKER, s.worker);
    b.field(DP_RANK, s.dp_rank.into());
    b.field(LANE, s.lane.into());
    b.field(DEPTH, s.depth.into());
    b.field(TOTAL_BLOCKS, s.total_blocks.into());
    b.field(INFERRED, s.inferred.into());
    if s.intervals.is_empty() {
        b.field(GAPPED, s.gapped.into());
        out.extend_from_slice(&[SCORES_KEY, b.len as u8]);
        out.extend_from_slice(&b.bytes[..b.len]);
        return;
    }
    out.push(SCORES_KEY);
    encode_varint(s.encoded_len() as u64, out);
    out.extend_from_slice(&b.bytes[..b.len]);
    for i in &s.intervals {
        out.push(INTERVALS);
        encode_varint(i.encoded_len() as u64, out);
        i.encode_raw(out);
    }
    if s.gapped {
        out.extend_from_slice(&[GAPPED, 1]);
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
    if fill_in_order(s, body) {
        return true;
    }
    *s = WorkerScore::default();
    fill_any_order(s, body)
}

/// The fields in number order, each at most once (intervals any number of times), which is
/// how prost writes a score: one well-predicted test per field instead of a jump-table dispatch
/// per field. `false` as soon as the body is anything else; `fill_any_order` then reads it
/// again. Equivalent where it succeeds: with each field present at most once, "last value
/// wins" and "the only value" agree.
#[inline(always)]
fn fill_in_order(s: &mut WorkerScore, body: &[u8]) -> bool {
    let mut buf = body;
    if let Some(v) = varint_field(&mut buf, WORKER) {
        s.worker = v;
    }
    // uint32 and bool from a varint as prost reads them: truncated, and non-zero.
    if let Some(v) = varint_field(&mut buf, DP_RANK) {
        s.dp_rank = v as u32;
    }
    if let Some(v) = varint_field(&mut buf, LANE) {
        s.lane = v as u32;
    }
    if let Some(v) = varint_field(&mut buf, DEPTH) {
        s.depth = v as u32;
    }
    if let Some(v) = varint_field(&mut buf, TOTAL_BLOCKS) {
        s.total_blocks = v as u32;
    }
    if let Some(v) = varint_field(&mut buf, INFERRED) {
        s.inferred = v != 0;
    }
    while let Some((&INTERVALS, tail)) = buf.split_first() {
        buf = tail;
        match interval(&mut buf) {
            Some(i) => s.intervals.push(i),
            None => return false,
        }
    }
    if let Some(v) = varint_field(&mut buf, GAPPED) {
        s.gapped = v != 0;
    }
    buf.is_empty()
}

/// The value of the varint field `key` if it comes next in `buf` (and parses), consuming it.
#[inline(always)]
fn varint_field(buf: &mut &[u8], key: u8) -> Option<u64> {
    let (&k, tail) = buf.split_first()?;
    if k != key {
        return None;
    }
    let mut rest = tail;
    let v = varint(&mut rest)?;
    *buf = rest;
    Some(v)
}

/// Any order, repeats allowed (last value wins, intervals append), as prost reads a message.
fn fill_any_order(s: &mut WorkerScore, body: &[u8]) -> bool {
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
/// slower here (`match-codec-bench`: 7.5–8.4 against 6.0–6.3 µs). One- and two-byte values
/// (keys, lengths, depths, most worker ids) take the first branch.
#[inline(always)]
fn varint(buf: &mut &[u8]) -> Option<u64> {
    match *buf {
        [b0, rest @ ..] if *b0 < 0x80 => {
            *buf = rest;
            Some(u64::from(*b0))
        }
        [b0, b1, rest @ ..] if *b1 < 0x80 => {
            *buf = rest;
            Some(u64::from(*b0 & 0x7f) | u64::from(*b1) << 7)
        }
        _ => varint_long(buf),
    }
}

#[inline(never)]
fn varint_long(buf: &mut &[u8]) -> Option<u64> {
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

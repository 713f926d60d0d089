//! The common vLLM batch decoded without building a `Value` tree.
//!
//! vLLM (0.34) sends a positional batch `[ts, [event...], dp_rank]` whose events are maps
//! tagged by a leading `"type"` key, with msgspec's `omit_defaults`: a store is `type`,
//! `block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `lora_id`, `medium`,
//! `lora_name`, and nothing else unless set. Decoding it through `rmpv` made a `Value` per token
//! (tens of thousands per batch) and was a quarter of a replica's CPU while it absorbed the
//! conversation trace from 256 engines (docs/benchmarks.md, "Against the real dynamo.indexer").
//!
//! [`decode`] reads exactly that shape straight from the bytes and gives up (`None`) at the first
//! thing outside it: another layout, another field, a value of another type, a duplicate key,
//! trailing bytes, a truncated payload. The caller then decodes the payload with the general
//! decoder ([`super::decode_batch_general`]), so the two agree on everything this path accepts
//! (a differential test over generated payloads in `bridge/tests/wire.rs`) and the general
//! decoder alone decides everything else: unknown fields, malformed events, other layouts.
//! A declared length sizes no reservation past a small cap (`RESERVE_EVENTS`,
//! `RESERVE_ITEMS`): vectors grow with what is actually read.

use super::{Batch, Event, ExtraKeys, Lookahead, Residency, Salt, Tokens, MAX_EVENTS, MAX_VALUES};
use std::sync::atomic::{AtomicU64, Ordering};

/// A msgpack integer as marked on the wire.
#[derive(Clone, Copy)]
enum Int {
    U(u64),
    I(i64),
}

impl Int {
    /// A block hash: bitwise, as the general decoder reads a signed one.
    fn hash(self) -> u64 {
        match self {
            Int::U(x) => x,
            Int::I(x) => x as u64,
        }
    }

    fn unsigned(self) -> Option<u64> {
        match self {
            Int::U(x) => Some(x),
            Int::I(x) => u64::try_from(x).ok(),
        }
    }

    fn u32(self) -> Option<u32> {
        self.unsigned().and_then(|x| u32::try_from(x).ok())
    }
}

/// A cursor over the payload; every read is bounds-checked and `None` past the end.
struct Reader<'a> {
    buf: &'a [u8],
    /// Array elements declared so far: past [`MAX_VALUES`] the general decoder refuses it.
    values: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    fn be<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn peek(&self) -> Option<u8> {
        self.buf.first().copied()
    }

    fn marker(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    /// An integer of any width, or `None` for anything else.
    fn int(&mut self) -> Option<Int> {
        let m = self.marker()?;
        Some(match m {
            0x00..=0x7f => Int::U(u64::from(m)),
            0xe0..=0xff => Int::I(i64::from(m as i8)),
            0xcc => Int::U(u64::from(self.be::<1>()?[0])),
            0xcd => Int::U(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Int::U(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Int::U(u64::from_be_bytes(self.be()?)),
            0xd0 => Int::I(i64::from(self.be::<1>()?[0] as i8)),
            0xd1 => Int::I(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => Int::I(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => Int::I(i64::from_be_bytes(self.be()?)),
            _ => return None,
        })
    }

    /// Consumes a nil and says so; leaves anything else.
    fn nil(&mut self) -> bool {
        let is = self.peek() == Some(0xc0);
        if is {
            self.buf = &self.buf[1..];
        }
        is
    }

    fn str(&mut self) -> Option<&'a str> {
        let m = self.marker()?;
        let len = match m {
            0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => usize::from(self.be::<1>()?[0]),
            0xda => usize::from(u16::from_be_bytes(self.be()?)),
            0xdb => u32::from_be_bytes(self.be()?) as usize,
            _ => return None,
        };
        std::str::from_utf8(self.take(len)?).ok()
    }

    fn opt_str(&mut self) -> Option<Option<&'a str>> {
        if self.nil() {
            return Some(None);
        }
        self.str().map(Some)
    }

    fn opt_int(&mut self) -> Option<Option<Int>> {
        if self.nil() {
            return Some(None);
        }
        self.int().map(Some)
    }

    /// An array's length, bounded by the bytes left (every element takes at least one).
    fn array_len(&mut self) -> Option<usize> {
        let m = self.marker()?;
        let len = match m {
            0x90..=0x9f => usize::from(m & 0x0f),
            0xdc => usize::from(u16::from_be_bytes(self.be()?)),
            0xdd => u32::from_be_bytes(self.be()?) as usize,
            _ => return None,
        };
        self.values += len;
        (len <= self.buf.len() && self.values <= MAX_VALUES).then_some(len)
    }

    /// A map's length, bounded by the bytes left (every entry takes at least two).
    fn map_len(&mut self) -> Option<usize> {
        let m = self.marker()?;
        let len = match m {
            0x80..=0x8f => usize::from(m & 0x0f),
            0xde => usize::from(u16::from_be_bytes(self.be()?)),
            0xdf => u32::from_be_bytes(self.be()?) as usize,
            _ => return None,
        };
        (len <= self.buf.len() / 2).then_some(len)
    }

    fn f64(&mut self) -> Option<f64> {
        match self.marker()? {
            0xcb => Some(f64::from_be_bytes(self.be()?)),
            _ => None,
        }
    }
}

/// Most events reserved ahead from a declared length: an event is hundreds of bytes in memory
/// and one byte of header can declare one, so a hostile length must not size the reservation.
/// Past it, the vector grows with the events actually read.
const RESERVE_EVENTS: usize = 64;
/// Most hashes or token ids reserved ahead from a declared length (the same reason).
const RESERVE_ITEMS: usize = 4096;

static FAST_BATCHES: AtomicU64 = AtomicU64::new(0);

/// Batches this process decoded by the fast path (tests check it is taken).
pub fn fast_batches() -> u64 {
    FAST_BATCHES.load(Ordering::Relaxed)
}

/// The batch, if it has exactly the common shape (module doc); `None` otherwise.
pub(super) fn decode(payload: &[u8]) -> Option<Batch> {
    let batch = decode_common(payload)?;
    FAST_BATCHES.fetch_add(1, Ordering::Relaxed);
    Some(batch)
}

fn decode_common(payload: &[u8]) -> Option<Batch> {
    let mut rd = Reader { buf: payload, values: 0 };
    let n = rd.array_len()?;
    if !(2..=3).contains(&n) {
        return None;
    }
    let ts = rd.f64()?;
    let events = rd.array_len()?;
    if events > MAX_EVENTS {
        return None; // the general decoder refuses it
    }
    let mut out = Vec::with_capacity(events.min(RESERVE_EVENTS));
    for _ in 0..events {
        out.push(event(&mut rd)?);
    }
    let dp_rank = if n == 3 { rd.opt_int()?.and_then(Int::u32) } else { None };
    if !rd.buf.is_empty() {
        return None;
    }
    Some(Batch { ts, dp_rank, events: out, ignored_fields: 0, ignored_names: Vec::new() })
}

/// One map event whose first key is `type`: a store, a removal or a clear.
fn event(rd: &mut Reader<'_>) -> Option<Event> {
    let n = rd.map_len()?;
    if n == 0 || rd.str()? != "type" {
        return None;
    }
    match rd.str()? {
        "BlockStored" => stored(rd, n - 1),
        "BlockRemoved" => removed(rd, n - 1),
        "AllBlocksCleared" => (n == 1).then_some(Event::Cleared),
        _ => None,
    }
}

/// Marks `bit` in `seen`; `None` if it was already there (a duplicate key).
fn once(seen: &mut u32, bit: u32) -> Option<()> {
    let fresh = *seen & bit == 0;
    *seen |= bit;
    fresh.then_some(())
}

fn hashes(rd: &mut Reader<'_>) -> Option<Vec<u64>> {
    let n = rd.array_len()?;
    let mut out = Vec::with_capacity(n.min(RESERVE_ITEMS));
    for _ in 0..n {
        out.push(rd.int()?.hash());
    }
    Some(out)
}

fn stored(rd: &mut Reader<'_>, fields: usize) -> Option<Event> {
    let (mut seen, mut hashes_, mut tokens) = (0u32, None, None);
    let (mut parent, mut block_size, mut medium, mut lora_name) = (None, None, None, None);
    for _ in 0..fields {
        match rd.str()? {
            "block_hashes" => {
                once(&mut seen, 1)?;
                hashes_ = Some(hashes(rd)?);
            }
            "parent_block_hash" => {
                once(&mut seen, 2)?;
                parent = rd.opt_int()?.map(Int::hash);
            }
            "token_ids" => {
                once(&mut seen, 4)?;
                let n = rd.array_len()?;
                let mut ids = Vec::with_capacity(n.min(RESERVE_ITEMS));
                for _ in 0..n {
                    ids.push(rd.int()?.u32()?);
                }
                tokens = Some(ids);
            }
            "block_size" => {
                once(&mut seen, 8)?;
                block_size = match rd.opt_int()? {
                    None => None,
                    Some(i) => Some(i.unsigned()?),
                };
            }
            "lora_id" => {
                once(&mut seen, 16)?;
                rd.nil().then_some(())?;
            }
            "medium" => {
                once(&mut seen, 32)?;
                medium = rd.opt_str()?.map(str::to_string);
            }
            "lora_name" => {
                once(&mut seen, 64)?;
                lora_name = rd.opt_str()?.filter(|s| !s.is_empty()).map(str::to_string);
            }
            _ => return None,
        }
    }
    Some(Event::Stored {
        hashes: hashes_?,
        parent,
        tokens: Tokens::Ids(tokens?),
        block_size,
        medium,
        lora_id: None,
        lora_name,
        extra_keys: ExtraKeys::Absent,
        group_idx: None,
        kv_cache_spec_kind: None,
        kv_cache_spec_sliding_window: None,
        lookahead: Lookahead::Absent,
        cache_salt: Salt::Absent,
        residency: Residency::default(),
        mm_infos: false,
        unknown: Vec::new(),
    })
}

fn removed(rd: &mut Reader<'_>, fields: usize) -> Option<Event> {
    let (mut seen, mut hashes_, mut medium) = (0u32, None, None);
    for _ in 0..fields {
        match rd.str()? {
            "block_hashes" => {
                once(&mut seen, 1)?;
                hashes_ = Some(hashes(rd)?);
            }
            "medium" => {
                once(&mut seen, 2)?;
                medium = rd.opt_str()?.map(str::to_string);
            }
            _ => return None,
        }
    }
    Some(Event::Removed { hashes: hashes_?, medium, group_idx: None, residency: Residency::default() })
}

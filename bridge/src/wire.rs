//! Decoding vLLM / SGLang KV-event messages (ZeroMQ frames + msgpack) into [`Batch`]es.
//!
//! A message is three frames: topic, an 8-byte big-endian sequence number, and a msgpack
//! `KVEventBatch`. Two encodings are seen in the wild (see `shared/notes/kv-events.md`):
//! - positional (msgspec `array_like=True`, vLLM 0.9–0.15 and SGLang): batch
//!   `[ts, [event...], dp_rank?]`, event `["BlockStored", block_hashes, parent, token_ids,
//!   block_size, lora_id, medium?, lora_name?, extra_keys?, ...tail]`,
//!   `["BlockRemoved", block_hashes, medium?, group_idx?]`, `["AllBlocksCleared"]`;
//! - map (no `array_like`, `omit_defaults=True`): `{"ts", "events", "data_parallel_rank"}` with
//!   events `{"type": "BlockStored", "block_hashes": .., ...}`; absent keys take defaults.
//!
//! The positional BlockStored tail has two variants: upstream vLLM declares
//! `group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window` right after `extra_keys`;
//! Dynamo's decoder reads `block_mm_infos` first. They are told apart by type (`group_idx` is
//! an int, `block_mm_infos` a list, `kv_cache_spec_kind` a string).
//!
//! Hashes arrive as u64 (vLLM), signed i64 (SGLang) or raw digest bytes (vLLM with
//! `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`); all become a u64 bitwise (bytes: the low 64 bits
//! of the big-endian digest, the same value vLLM's int conversion gives).
//!
//! Unknown fields and unknown event types are ignored and counted; a malformed event is
//! reported as [`Event::Malformed`] without spoiling the rest of its batch. Nothing here
//! panics on any input (property-tested in `bridge/tests/wire.rs`).
//!
//! msgpack is read with `rmpv` (dynamic values) rather than `rmp-serde`: both layouts, the
//! optional tails, signed-or-unsigned hashes and unknown-field counting are easier over a
//! `Value`; `rmpv` bounds nesting depth and preallocation, and [`scan`] the count of values
//! and events, so hostile input cannot overflow the stack or allocate gigabytes. vLLM's common
//! batch is read straight from the bytes first ([`fast`]: a `Value` per token was a quarter
//! of the absorbing replica's CPU).

use rmpv::Value;

mod fast;
mod scan;
pub use fast::fast_batches;
pub use scan::{MAX_DEPTH, MAX_EVENTS, MAX_VALUES};

/// A stored block's token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tokens {
    /// Plain token ids, each fitting u32.
    Ids(Vec<u32>),
    /// SGLang with EAGLE speculative decoding (`RadixKey.is_bigram`): position `j` is the pair
    /// (token `j`, token `j + 1`), so a page also covers the token after it.
    Bigrams(Vec<[u32; 2]>),
    /// Not representable: negative or > u32 ids, non-integers, lists other than pairs.
    Unsupported,
}

/// One element of a block's `extra_keys` tuple.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtraKey {
    /// A string: the LoRA name, a multimodal identifier or the cache salt.
    Text(String),
    /// `(identifier, offset)`: older vLLM's multimodal key.
    TextAt(String, i64),
    /// Raw bytes (prompt-embeds hashes), of this length.
    Bytes(usize),
    /// Anything else (an int, a float, a nested list of another shape, a map).
    Other,
}

/// A BlockStored's `extra_keys` field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ExtraKeys {
    /// Absent or nil.
    #[default]
    Absent,
    /// One entry per block: `None` for a nil entry, else the tuple's elements.
    Blocks(Vec<Option<Vec<ExtraKey>>>),
    /// Present but not a list.
    Unparsed,
}

/// One decoded KV event. Stores dominate real batches, so the other variants' unused room costs
/// little in a batch's short-lived `Vec`, and boxing would allocate once more per store.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Event {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Tokens,
        block_size: Option<u64>,
        medium: Option<String>,
        /// vLLM's deprecated integer LoRA id (SGLang's `lora_id`).
        lora_id: Option<i64>,
        lora_name: Option<String>,
        /// vLLM's per-block extra hash keys (LoRA name, multimodal identifiers, cache salt,
        /// prompt-embeds hashes), as sent; `session` decides what it can index.
        extra_keys: ExtraKeys,
        group_idx: Option<u32>,
        kv_cache_spec_kind: Option<String>,
        kv_cache_spec_sliding_window: Option<u64>,
        /// vLLM's `lookahead_token_ids`: per block, the tokens after it its hash covers.
        lookahead: Lookahead,
        /// SGLang's top-level `cache_salt` (every block of the store is under it).
        cache_salt: Salt,
        /// Where the blocks are (`locality`, `ownership`): see [`Residency`].
        residency: Residency,
        /// Dynamo's positional `block_mm_infos` was present and not empty: multimodal data
        /// that keys the blocks in a way this bridge does not read.
        mm_infos: bool,
        /// Fields this decoder does not know that carry a value (names; positional ones as
        /// `BlockStored[i]`): any of them may change what the block is, so the store is refused.
        unknown: Vec<String>,
    },
    Removed {
        hashes: Vec<u64>,
        medium: Option<String>,
        group_idx: Option<u32>,
        residency: Residency,
    },
    Cleared,
    /// An event type this build does not know (ignored, counted).
    Unknown(String),
    /// A known event type with a required field missing or of the wrong type.
    Malformed(&'static str),
}

/// A BlockStored's `lookahead_token_ids`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Lookahead {
    #[default]
    Absent,
    /// One token list per block.
    Blocks(Vec<Vec<u32>>),
    /// Present but not a list of token lists (or tokens not u32).
    Unparsed,
}

/// A BlockStored's top-level `cache_salt` (SGLang).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Salt {
    #[default]
    Absent,
    Text(String),
    Unparsed,
}

/// vLLM's `locality` (`LOCAL`/`REMOTE` relative to the publisher) and `ownership` (the secondary
/// offloading tier that generated the event) of a store or removal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Residency {
    pub locality: Option<String>,
    pub ownership: Option<String>,
}

impl Residency {
    /// The publisher's own primary copy: no locality or `LOCAL`, no secondary owner.
    pub fn is_own(&self) -> bool {
        self.ownership.is_none() && self.locality.as_deref().is_none_or(|l| l.eq_ignore_ascii_case("local"))
    }
}

/// A decoded `KVEventBatch`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub ts: f64,
    pub dp_rank: Option<u32>,
    pub events: Vec<Event>,
    /// Fields (map keys or positional elements) this decoder does not know, summed over the
    /// batch and its events.
    pub ignored_fields: u64,
    /// Their names (positional ones as `Tag[i]`), in the order met, each once per batch.
    pub ignored_names: Vec<String>,
}

/// A whole ZeroMQ message.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub topic: Vec<u8>,
    pub seq: u64,
    pub batch: Batch,
}

/// Why a message could not be decoded at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WireError {
    #[error("expected 3 frames (topic, seq, payload)")]
    Frames,
    #[error("sequence frame is not 8 bytes")]
    SeqFrame,
    #[error("payload is not msgpack")]
    Msgpack,
    #[error("payload is not a KVEventBatch (array or map with events)")]
    NotABatch,
    #[error("payload holds more than {MAX_VALUES} msgpack values or {MAX_EVENTS} events")]
    TooLarge,
}

impl WireError {
    pub fn as_str(self) -> &'static str {
        match self {
            WireError::Frames => "frames",
            WireError::SeqFrame => "seq_frame",
            WireError::Msgpack => "msgpack",
            WireError::NotABatch => "not_a_batch",
            WireError::TooLarge => "too_large",
        }
    }
}

/// Reads an 8-byte big-endian sequence frame.
pub fn decode_seq(frame: &[u8]) -> Result<u64, WireError> {
    let b: [u8; 8] = frame.try_into().map_err(|_| WireError::SeqFrame)?;
    Ok(u64::from_be_bytes(b))
}

/// Decodes a 3-frame message.
pub fn decode_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<Message, WireError> {
    let [topic, seq, payload] = frames else { return Err(WireError::Frames) };
    Ok(Message {
        topic: topic.as_ref().to_vec(),
        seq: decode_seq(seq.as_ref())?,
        batch: decode_batch(payload.as_ref())?,
    })
}

/// Most distinct unknown-field names a batch reports (the rest are only counted).
pub const MAX_NAMES: usize = 16;
/// Longest unknown-field name reported (names come from the peer).
const MAX_NAME_BYTES: usize = 64;

/// Decodes a msgpack `KVEventBatch` payload (either layout): vLLM's common batch straight from
/// the bytes ([`fast`]), anything else by [`decode_batch_general`].
pub fn decode_batch(payload: &[u8]) -> Result<Batch, WireError> {
    fast::decode(payload).map_or_else(|| decode_batch_general(payload), Ok)
}

/// Decodes any payload through a `Value` tree: every layout, unknown fields counted, malformed
/// events reported. [`decode_batch`]'s fast path must agree with it wherever it answers.
pub fn decode_batch_general(payload: &[u8]) -> Result<Batch, WireError> {
    if !scan::within(payload, MAX_VALUES) {
        return Err(WireError::TooLarge);
    }
    let mut rd = payload;
    // Real batches nest ~6 levels; rmpv counts two per level (its 1024 overflows a 2 MiB stack).
    let v = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH).map_err(|_| WireError::Msgpack)?;
    let mut ignored = u64::from(!rd.is_empty());
    let mut names = Vec::new();
    if ignored > 0 {
        names.push("trailing bytes".to_string());
    }
    let (ts, events, dp) = match &v {
        Value::Array(a) => {
            if a.len() < 2 {
                return Err(WireError::NotABatch);
            }
            ignored += a.len().saturating_sub(3) as u64;
            names.extend((3..a.len()).map(|i| format!("EventBatch[{i}]")));
            (&a[0], &a[1], a.get(2))
        }
        Value::Map(m) => {
            let (mut ts, mut events, mut dp) = (None, None, None);
            for (k, val) in m {
                match k.as_str() {
                    Some("ts") => ts = Some(val),
                    Some("events") => events = Some(val),
                    // vLLM's name, and SGLang's (its batch is positional in every release read).
                    Some("data_parallel_rank" | "attn_dp_rank") => dp = Some(val),
                    other => {
                        ignored += 1;
                        names.push(other.map_or_else(|| "EventBatch{non-string key}".into(), str::to_string));
                    }
                }
            }
            (ts.unwrap_or(&Value::Nil), events.ok_or(WireError::NotABatch)?, dp)
        }
        _ => return Err(WireError::NotABatch),
    };
    let Value::Array(events) = events else { return Err(WireError::NotABatch) };
    if events.len() > MAX_EVENTS {
        return Err(WireError::TooLarge);
    }
    let ts = match ts {
        Value::F64(f) => *f,
        Value::F32(f) => f64::from(*f),
        Value::Integer(i) => i.as_f64().unwrap_or(0.0),
        _ => 0.0,
    };
    let dp_rank = dp.and_then(as_u32);
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        let (ev, ign) = decode_event(e);
        ignored += ign.len() as u64;
        for n in ign {
            if names.len() < MAX_NAMES && !names.contains(&n) {
                names.push(n);
            }
        }
        out.push(ev);
    }
    Ok(Batch { ts, dp_rank, events: out, ignored_fields: ignored, ignored_names: names })
}

fn as_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|x| u32::try_from(x).ok())
}

fn opt_str(v: Option<&Value>) -> Result<Option<String>, ()> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::String(s)) => Ok(s.as_str().map(str::to_string)),
        // StorageMedium enums or other encodings: keep a printable form.
        Some(Value::Integer(i)) => Ok(Some(i.to_string())),
        Some(_) => Err(()),
    }
}

fn opt_u32(v: Option<&Value>) -> Result<Option<u32>, ()> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(x) => as_u32(x).map(Some).ok_or(()),
    }
}

fn opt_u64(v: Option<&Value>) -> Result<Option<u64>, ()> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(x) => x.as_u64().map(Some).ok_or(()),
    }
}

/// A block hash: u64, i64 (bitwise), or digest bytes (low 64 bits, big-endian).
pub fn hash_of(v: &Value) -> Option<u64> {
    match v {
        Value::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|x| x as u64)),
        Value::Binary(b) => {
            let tail = &b[b.len().saturating_sub(8)..];
            Some(tail.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x)))
        }
        _ => None,
    }
}

fn hashes(v: Option<&Value>) -> Option<Vec<u64>> {
    match v? {
        Value::Array(a) => a.iter().map(hash_of).collect(),
        _ => None,
    }
}

fn parent(v: Option<&Value>) -> Result<Option<u64>, ()> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(x) => hash_of(x).map(Some).ok_or(()),
    }
}

fn tokens(v: Option<&Value>) -> Option<Tokens> {
    let Value::Array(a) = v? else { return None };
    if let Some(ids) = a.iter().map(as_u32).collect::<Option<Vec<u32>>>() {
        return Some(Tokens::Ids(ids));
    }
    let pair = |x: &Value| match x {
        Value::Array(p) if p.len() == 2 => Some([as_u32(&p[0])?, as_u32(&p[1])?]),
        _ => None,
    };
    Some(a.iter().map(pair).collect::<Option<Vec<_>>>().map_or(Tokens::Unsupported, Tokens::Bigrams))
}

/// The fields of a BlockStored event by name, from either layout.
#[derive(Default)]
struct StoredFields<'a> {
    block_hashes: Option<&'a Value>,
    parent: Option<&'a Value>,
    token_ids: Option<&'a Value>,
    block_size: Option<&'a Value>,
    medium: Option<&'a Value>,
    lora_id: Option<&'a Value>,
    lora_name: Option<&'a Value>,
    extra_keys: Option<&'a Value>,
    group_idx: Option<&'a Value>,
    kind: Option<&'a Value>,
    window: Option<&'a Value>,
    lookahead: Option<&'a Value>,
    cache_salt: Option<&'a Value>,
    locality: Option<&'a Value>,
    ownership: Option<&'a Value>,
    mm_infos: Option<&'a Value>,
    /// Unknown fields with a value.
    unknown: Vec<String>,
}

fn stored(mut f: StoredFields<'_>) -> Event {
    let Some(hashes) = hashes(f.block_hashes) else { return Event::Malformed("block_hashes") };
    let Ok(parent) = parent(f.parent) else { return Event::Malformed("parent_block_hash") };
    let Some(tokens) = tokens(f.token_ids) else { return Event::Malformed("token_ids") };
    let Ok(block_size) = opt_u64(f.block_size) else { return Event::Malformed("block_size") };
    let Ok(medium) = opt_str(f.medium) else { return Event::Malformed("medium") };
    let Ok(group_idx) = opt_u32(f.group_idx) else { return Event::Malformed("group_idx") };
    // Metadata only: a wrong type here is ignored rather than fatal.
    let lora_name = opt_str(f.lora_name).ok().flatten().filter(|s| !s.is_empty());
    let lora_id = match f.lora_id {
        None | Some(Value::Nil) => None,
        Some(v) => Some(v.as_i64().unwrap_or(-1)),
    };
    let extra_keys = extra_keys(f.extra_keys);
    let kv_cache_spec_kind = opt_str(f.kind).ok().flatten();
    let kv_cache_spec_sliding_window = opt_u64(f.window).ok().flatten();
    let lookahead = lookahead(f.lookahead);
    let cache_salt = match f.cache_salt {
        None | Some(Value::Nil) => Salt::Absent,
        Some(Value::String(s)) => match s.as_str() {
            Some("") => Salt::Absent,
            Some(s) => Salt::Text(s.to_string()),
            None => Salt::Unparsed,
        },
        Some(_) => Salt::Unparsed,
    };
    let residency = match residency(f.locality, f.ownership) {
        Ok(r) => r,
        Err(field) => {
            // A locality or owner we cannot read: where the blocks are is unknown.
            f.unknown.push(field.to_string());
            Residency::default()
        }
    };
    let mm_infos = match f.mm_infos {
        None | Some(Value::Nil) => false,
        Some(Value::Array(a)) => a.iter().any(|x| !x.is_nil()),
        Some(_) => true,
    };
    Event::Stored {
        hashes,
        parent,
        tokens,
        block_size,
        medium,
        lora_id,
        lora_name,
        extra_keys,
        group_idx,
        kv_cache_spec_kind,
        kv_cache_spec_sliding_window,
        lookahead,
        cache_salt,
        residency,
        mm_infos,
        unknown: f.unknown,
    }
}

fn lookahead(v: Option<&Value>) -> Lookahead {
    match v {
        None | Some(Value::Nil) => Lookahead::Absent,
        Some(Value::Array(blocks)) => {
            let lists: Option<Vec<Vec<u32>>> = blocks
                .iter()
                .map(|b| match b {
                    Value::Array(t) => t.iter().map(as_u32).collect(),
                    _ => None,
                })
                .collect();
            lists.map_or(Lookahead::Unparsed, Lookahead::Blocks)
        }
        Some(_) => Lookahead::Unparsed,
    }
}

/// `locality` and `ownership`: strings or nil; `Err` names the field of another type.
fn residency(locality: Option<&Value>, ownership: Option<&Value>) -> Result<Residency, &'static str> {
    Ok(Residency {
        locality: opt_str(locality).map_err(|()| "locality")?,
        ownership: opt_str(ownership).map_err(|()| "ownership")?,
    })
}

/// Parses `extra_keys` liberally: any shape decodes, and `session` refuses what it cannot hash.
fn extra_keys(v: Option<&Value>) -> ExtraKeys {
    let entry = |e: &Value| match e {
        Value::Nil => None,
        Value::Array(keys) => Some(keys.iter().map(extra_key).collect()),
        _ => Some(vec![ExtraKey::Other]),
    };
    match v {
        None | Some(Value::Nil) => ExtraKeys::Absent,
        Some(Value::Array(a)) => ExtraKeys::Blocks(a.iter().map(entry).collect()),
        Some(_) => ExtraKeys::Unparsed,
    }
}

fn extra_key(k: &Value) -> ExtraKey {
    match k {
        Value::String(s) => s.as_str().map_or(ExtraKey::Other, |s| ExtraKey::Text(s.to_string())),
        Value::Binary(b) => ExtraKey::Bytes(b.len()),
        Value::Array(a) => match a.as_slice() {
            [Value::String(s), Value::Integer(off)] => match (s.as_str(), off.as_i64()) {
                (Some(s), Some(off)) => ExtraKey::TextAt(s.to_string(), off),
                _ => ExtraKey::Other,
            },
            _ => ExtraKey::Other,
        },
        _ => ExtraKey::Other,
    }
}

fn removed(
    h: Option<&Value>,
    medium: Option<&Value>,
    group: Option<&Value>,
    locality: Option<&Value>,
    ownership: Option<&Value>,
) -> Event {
    let Some(hashes) = hashes(h) else { return Event::Malformed("block_hashes") };
    let Ok(medium) = opt_str(medium) else { return Event::Malformed("medium") };
    let Ok(group_idx) = opt_u32(group) else { return Event::Malformed("group_idx") };
    let Ok(residency) = residency(locality, ownership) else { return Event::Malformed("locality") };
    Event::Removed { hashes, medium, group_idx, residency }
}

/// Decodes one event; returns it and the names of the fields ignored.
fn decode_event(v: &Value) -> (Event, Vec<String>) {
    match v {
        Value::Array(a) => decode_positional(a),
        Value::Map(m) => decode_map(m),
        _ => (Event::Malformed("event"), Vec::new()),
    }
}

/// A peer-supplied field name, bounded for logs and labels.
fn field_name(k: &Value) -> String {
    let name = k.as_str().unwrap_or("(non-string key)");
    let mut end = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

fn decode_positional(a: &[Value]) -> (Event, Vec<String>) {
    let Some(tag) = a.first().and_then(Value::as_str) else { return (Event::Malformed("tag"), Vec::new()) };
    // Elements past the known ones; a nil one is a default and says nothing.
    let extra = |tag: &str, known: usize| -> Vec<String> {
        (known..a.len()).filter(|&i| !a[i].is_nil()).map(|i| format!("{tag}[{i}]")).collect()
    };
    match tag {
        "BlockStored" => {
            // Which tail layout (see the module doc): upstream vLLM `group_idx, kind, window`
            // at 9..=11 (then, in its field order, `locality, ownership, session_id,
            // lookahead_token_ids` at 12..=15), or Dynamo's `block_mm_infos, group_idx, kind,
            // window` at 9..=12.
            let dynamo_tail = matches!(
                (a.get(9), a.get(10)),
                (Some(Value::Array(_)), _) | (Some(Value::Nil), Some(Value::Integer(_)))
            );
            let (g, known) = if dynamo_tail { (10, 13) } else { (9, 16) };
            let upstream = |i: usize| if dynamo_tail { None } else { a.get(i) };
            let unknown = extra("BlockStored", known);
            let f = StoredFields {
                block_hashes: a.get(1),
                parent: a.get(2),
                token_ids: a.get(3),
                block_size: a.get(4),
                medium: a.get(6),
                lora_id: a.get(5),
                lora_name: a.get(7),
                extra_keys: a.get(8),
                group_idx: a.get(g),
                kind: a.get(g + 1),
                window: a.get(g + 2),
                locality: upstream(12),
                ownership: upstream(13),
                lookahead: upstream(15),
                cache_salt: None,
                mm_infos: if dynamo_tail { a.get(9) } else { None },
                unknown: unknown.clone(),
            };
            (stored(f), unknown)
        }
        "BlockRemoved" => {
            // vLLM: medium, group_idx, locality, ownership.
            let ev = removed(a.get(1), a.get(2), a.get(3), a.get(4), a.get(5));
            (ev, extra("BlockRemoved", 6))
        }
        "AllBlocksCleared" => (Event::Cleared, extra("AllBlocksCleared", 1)),
        other => (Event::Unknown(other.to_string()), Vec::new()),
    }
}

fn decode_map(m: &[(Value, Value)]) -> (Event, Vec<String>) {
    let get = |k: &str| m.iter().find(|(key, _)| key.as_str() == Some(k)).map(|(_, v)| v);
    let Some(tag) = get("type").and_then(Value::as_str) else {
        return (Event::Malformed("type"), Vec::new());
    };
    // Keys this decoder does not know, with a value (msgspec's omit_defaults leaves defaults out;
    // a nil one says nothing).
    let unknown = |known: &[&str]| -> Vec<String> {
        m.iter()
            .filter(|(k, v)| !v.is_nil() && !k.as_str().is_some_and(|k| k == "type" || known.contains(&k)))
            .map(|(k, _)| field_name(k))
            .collect()
    };
    match tag {
        "BlockStored" => {
            let unknown = unknown(&STORED_FIELDS);
            let f = StoredFields {
                block_hashes: get("block_hashes"),
                parent: get("parent_block_hash"),
                token_ids: get("token_ids"),
                block_size: get("block_size"),
                medium: get("medium"),
                lora_id: get("lora_id"),
                lora_name: get("lora_name"),
                extra_keys: get("extra_keys"),
                group_idx: get("group_idx"),
                kind: get("kv_cache_spec_kind"),
                window: get("kv_cache_spec_sliding_window"),
                lookahead: get("lookahead_token_ids"),
                cache_salt: get("cache_salt"),
                locality: get("locality"),
                ownership: get("ownership"),
                mm_infos: get("block_mm_infos"),
                unknown: unknown.clone(),
            };
            (stored(f), unknown)
        }
        "BlockRemoved" => (
            removed(get("block_hashes"), get("medium"), get("group_idx"), get("locality"), get("ownership")),
            unknown(&["block_hashes", "medium", "group_idx", "locality", "ownership"]),
        ),
        "AllBlocksCleared" => (Event::Cleared, unknown(&[])),
        other => (Event::Unknown(other.to_string()), Vec::new()),
    }
}

/// Every BlockStored field this decoder reads, by the name vLLM (0.34), SGLang (0.5.23) or
/// Dynamo gives it. `session_id` (vLLM and SGLang: attribution only; "the hash does not depend
/// on it") is known and has no effect.
const STORED_FIELDS: [&str; 17] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "block_mm_infos",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
    "cache_salt",
];

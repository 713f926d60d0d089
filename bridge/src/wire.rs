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
//! optional positional tails, signed-or-unsigned hashes and unknown-field counting are all
//! easier to express over a `Value` than through serde derive, and `rmpv` bounds nesting depth
//! and preallocation, so hostile input cannot overflow the stack or allocate gigabytes.

use rmpv::Value;

/// A stored block's token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tokens {
    /// Plain token ids, each fitting u32.
    Ids(Vec<u32>),
    /// Not representable: bigram pairs (EAGLE), negative or > u32 ids, non-integers.
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

/// One decoded KV event.
#[derive(Clone, Debug, PartialEq)]
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
    },
    Removed {
        hashes: Vec<u64>,
        medium: Option<String>,
        group_idx: Option<u32>,
    },
    Cleared,
    /// An event type this build does not know (ignored, counted).
    Unknown(String),
    /// A known event type with a required field missing or of the wrong type.
    Malformed(&'static str),
}

/// A decoded `KVEventBatch`.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub ts: f64,
    pub dp_rank: Option<u32>,
    pub events: Vec<Event>,
    /// Fields (map keys or positional elements) this decoder does not know, summed over the
    /// batch and its events.
    pub ignored_fields: u64,
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
}

impl WireError {
    pub fn as_str(self) -> &'static str {
        match self {
            WireError::Frames => "frames",
            WireError::SeqFrame => "seq_frame",
            WireError::Msgpack => "msgpack",
            WireError::NotABatch => "not_a_batch",
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

/// Nesting limit passed to rmpv (it counts about two per level).
pub const MAX_DEPTH: usize = 64;

/// Decodes a msgpack `KVEventBatch` payload (either layout).
pub fn decode_batch(payload: &[u8]) -> Result<Batch, WireError> {
    let mut rd = payload;
    // Real batches nest ~6 levels (batch, events, event, extra_keys, tuple); rmpv counts two
    // per level. The default limit (1024) overflows a 2 MiB thread stack in debug builds.
    let v = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH).map_err(|_| WireError::Msgpack)?;
    let mut ignored = u64::from(!rd.is_empty());
    let (ts, events, dp) = match &v {
        Value::Array(a) => {
            if a.len() < 2 {
                return Err(WireError::NotABatch);
            }
            ignored += a.len().saturating_sub(3) as u64;
            (&a[0], &a[1], a.get(2))
        }
        Value::Map(m) => {
            let (mut ts, mut events, mut dp) = (None, None, None);
            for (k, val) in m {
                match k.as_str() {
                    Some("ts") => ts = Some(val),
                    Some("events") => events = Some(val),
                    Some("data_parallel_rank") => dp = Some(val),
                    _ => ignored += 1,
                }
            }
            (ts.unwrap_or(&Value::Nil), events.ok_or(WireError::NotABatch)?, dp)
        }
        _ => return Err(WireError::NotABatch),
    };
    let Value::Array(events) = events else { return Err(WireError::NotABatch) };
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
        ignored += ign;
        out.push(ev);
    }
    Ok(Batch { ts, dp_rank, events: out, ignored_fields: ignored })
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
    let ids: Option<Vec<u32>> = a.iter().map(as_u32).collect();
    Some(match ids {
        Some(ids) => Tokens::Ids(ids),
        None => Tokens::Unsupported,
    })
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
}

fn stored(f: StoredFields<'_>) -> Event {
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
    }
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

fn removed(h: Option<&Value>, medium: Option<&Value>, group: Option<&Value>) -> Event {
    let Some(hashes) = hashes(h) else { return Event::Malformed("block_hashes") };
    let Ok(medium) = opt_str(medium) else { return Event::Malformed("medium") };
    let Ok(group_idx) = opt_u32(group) else { return Event::Malformed("group_idx") };
    Event::Removed { hashes, medium, group_idx }
}

/// Decodes one event; returns it and the number of fields ignored.
fn decode_event(v: &Value) -> (Event, u64) {
    match v {
        Value::Array(a) => decode_positional(a),
        Value::Map(m) => decode_map(m),
        _ => (Event::Malformed("event"), 0),
    }
}

fn decode_positional(a: &[Value]) -> (Event, u64) {
    let Some(tag) = a.first().and_then(Value::as_str) else { return (Event::Malformed("tag"), 0) };
    match tag {
        "BlockStored" => {
            // Which tail layout (see the module doc): upstream vLLM `group_idx, kind, window`
            // at 9..=11, or Dynamo's `block_mm_infos, group_idx, kind, window` at 9..=12.
            let dynamo_tail = matches!(
                (a.get(9), a.get(10)),
                (Some(Value::Array(_)), _) | (Some(Value::Nil), Some(Value::Integer(_)))
            );
            let (g, known) = if dynamo_tail { (10, 13) } else { (9, 12) };
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
            };
            (stored(f), a.len().saturating_sub(known) as u64)
        }
        "BlockRemoved" => (removed(a.get(1), a.get(2), a.get(3)), a.len().saturating_sub(4) as u64),
        "AllBlocksCleared" => (Event::Cleared, a.len().saturating_sub(1) as u64),
        other => (Event::Unknown(other.to_string()), 0),
    }
}

fn decode_map(m: &[(Value, Value)]) -> (Event, u64) {
    let get = |k: &str| m.iter().find(|(key, _)| key.as_str() == Some(k)).map(|(_, v)| v);
    let Some(tag) = get("type").and_then(Value::as_str) else { return (Event::Malformed("type"), 0) };
    let count_unknown = |known: &[&str]| {
        m.iter().filter(|(k, _)| !k.as_str().is_some_and(|k| k == "type" || known.contains(&k))).count()
            as u64
    };
    match tag {
        "BlockStored" => {
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
            };
            let known = [
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
            ];
            (stored(f), count_unknown(&known))
        }
        "BlockRemoved" => (
            removed(get("block_hashes"), get("medium"), get("group_idx")),
            count_unknown(&["block_hashes", "medium", "group_idx"]),
        ),
        "AllBlocksCleared" => (Event::Cleared, count_unknown(&[])),
        other => (Event::Unknown(other.to_string()), 0),
    }
}

//! LMCache's cache-event envelope as its Kafka sink writes it: one JSON `CacheEventsRequest`
//! per record, keyed by `instance_id`.
//!
//! Written here field for field from LMCache 0.5.6 (Apache-2.0), not copied:
//! `lmcache/v1/mp_coordinator/schemas.py` (`CacheEventsRequest`),
//! `lmcache/v1/mp_coordinator/api.py` (`CacheEventBatch`, `CacheEventEntry`, `CacheEventType`,
//! `UNKNOWN_TOKEN_OFFSET`) and `lmcache/v1/distributed/api.py` (`EncodedObjectKey`, `Tier`,
//! `ObjectKey`'s invariants). [`decode`] applies the checks LMCache's own consumer applies
//! (pydantic validation and `__post_init__`): a record failing any of them is dropped whole by
//! LMCache's `KafkaCacheEventSource`, so it is refused whole here too.

use serde::Deserialize;

/// `CacheEventsRequest`: the batches of one record, in emission order.
#[derive(Clone, Debug, Deserialize)]
pub struct Envelope {
    #[serde(default)]
    pub batches: Vec<Batch>,
}

/// `CacheEventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    Store,
    Delete,
    Access,
    Config,
}

/// `Tier` (a cache event names a concrete tier: `all` is refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LmTier {
    L1,
    L2,
    All,
}

/// `CacheEventBatch`: same-typed events of one emitter.
#[derive(Clone, Debug, Deserialize)]
pub struct Batch {
    pub instance_id: String,
    pub incarnation: i64,
    pub seq: i64,
    pub event_type: EventType,
    pub tier: LmTier,
    #[serde(default)]
    pub backend: String,
    #[serde(default)]
    pub entries: Vec<Entry>,
    #[serde(default)]
    pub shared: bool,
    #[serde(default)]
    pub ts: f64,
    #[serde(default)]
    pub capacity_bytes: i64,
    #[serde(default)]
    pub capacity_revision: i64,
}

/// `CacheEventEntry`.
#[derive(Clone, Debug, Deserialize)]
pub struct Entry {
    pub key: Key,
    #[serde(default)]
    pub size_bytes: i64,
    /// The chunk's token ids (`store` only; empty when the emitter no longer held them).
    #[serde(default)]
    pub token_ids: Vec<i64>,
    /// Position of the chunk's first token, [`UNKNOWN_TOKEN_OFFSET`] when unreported.
    #[serde(default = "unknown_offset")]
    pub token_offset: i64,
}

/// `UNKNOWN_TOKEN_OFFSET`: the emitter did not report a position.
pub const UNKNOWN_TOKEN_OFFSET: i64 = -1;

fn unknown_offset() -> i64 {
    UNKNOWN_TOKEN_OFFSET
}

/// `EncodedObjectKey`: `ObjectKey` with the chunk hash in hex.
#[derive(Clone, Debug, Deserialize)]
pub struct Key {
    pub chunk_hash_hex: String,
    pub model_name: String,
    pub kv_rank: i64,
    #[serde(default)]
    pub object_group_id: i64,
    #[serde(default)]
    pub cache_salt: String,
}

/// Why a record was refused whole (LMCache's consumer drops it too).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not a CacheEventsRequest: {0}")]
    Json(String),
    #[error("batch {index}: {what}")]
    Invalid { index: usize, what: String },
}

/// Decodes and validates one record's value.
pub fn decode(value: &[u8]) -> Result<Vec<Batch>, WireError> {
    let env: Envelope = serde_json::from_slice(value).map_err(|e| WireError::Json(e.to_string()))?;
    for (index, b) in env.batches.iter().enumerate() {
        validate(b).map_err(|what| WireError::Invalid { index, what })?;
    }
    Ok(env.batches)
}

/// `CacheEventBatch.__post_init__`, `CacheEventEntry.__post_init__` and the envelope's key
/// check (`EncodedObjectKey.to_object_key` with `ObjectKey.__post_init__`).
fn validate(b: &Batch) -> Result<(), String> {
    if b.instance_id.is_empty() {
        return Err("instance_id must be non-empty".into());
    }
    if b.backend.is_empty() && b.event_type != EventType::Access {
        return Err(format!("backend must be non-empty for {:?} batches", b.event_type));
    }
    if b.event_type == EventType::Config && !b.entries.is_empty() {
        return Err("config batches carry no entries".into());
    }
    if b.incarnation < 0 || b.capacity_bytes < 0 || b.capacity_revision < 0 || b.ts < 0.0 {
        return Err("incarnation, ts and capacities must be >= 0".into());
    }
    if b.seq < 1 {
        return Err(format!("seq must be >= 1 (got {})", b.seq));
    }
    if b.tier == LmTier::All {
        return Err("cache events must target a concrete tier (got \"all\")".into());
    }
    for e in &b.entries {
        if e.size_bytes < 0 {
            return Err("size_bytes must be >= 0".into());
        }
        if e.token_offset < 0 && e.token_offset != UNKNOWN_TOKEN_OFFSET {
            return Err(format!("token_offset {} is negative", e.token_offset));
        }
        validate_key(&e.key)?;
    }
    Ok(())
}

fn validate_key(k: &Key) -> Result<(), String> {
    if chunk_hash(&k.chunk_hash_hex).is_none() {
        return Err(format!("chunk_hash_hex {:?} is not hex", k.chunk_hash_hex));
    }
    if k.model_name.contains('@') {
        return Err(format!("model_name {:?} contains '@'", k.model_name));
    }
    if k.object_group_id < 0 {
        return Err("object_group_id must be >= 0".into());
    }
    if k.cache_salt.chars().any(|c| matches!(c, '@' | '/' | '\\' | '\0'))
        || k.cache_salt.chars().count() > 128
    {
        return Err(format!("cache_salt {:?} is not a valid salt", k.cache_salt));
    }
    Ok(())
}

/// The bytes of a hex chunk hash (Python's `bytes.fromhex`: pairs of hex digits); `None` if
/// it is not hex.
pub fn chunk_hash(hex: &str) -> Option<Vec<u8>> {
    let hex: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    hex.chunks(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

/// The parts `ObjectKey.ComputeKVRank` packs into a `kv_rank`: (world size, global rank).
pub fn kv_rank_parts(kv_rank: i64) -> (u32, u32) {
    let r = kv_rank as u64;
    (((r >> 24) & 0xFF) as u32, ((r >> 16) & 0xFF) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORE: &str = r#"{"batches":[{"instance_id":"a","incarnation":7,"seq":1,"event_type":"store",
        "tier":"l1","backend":"dram","entries":[{"key":{"chunk_hash_hex":"0aff","model_name":"m",
        "kv_rank":16777216,"object_group_id":0,"cache_salt":""},"size_bytes":5,"token_ids":[1,2],
        "token_offset":0}],"shared":false,"ts":1.5,"capacity_bytes":0,"capacity_revision":0,
        "future_field":1}]}"#;

    #[test]
    fn decodes_the_sinks_envelope_and_ignores_unknown_fields() {
        let b = decode(STORE.as_bytes()).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].event_type, b[0].tier, b[0].seq), (EventType::Store, LmTier::L1, 1));
        assert_eq!(chunk_hash(&b[0].entries[0].key.chunk_hash_hex), Some(vec![0x0a, 0xff]));
        assert_eq!(kv_rank_parts(b[0].entries[0].key.kv_rank), (1, 0));
        let no_offset = STORE.replace(r#""token_offset":0"#, r#""renamed":0"#);
        assert_eq!(decode(no_offset.as_bytes()).unwrap()[0].entries[0].token_offset, UNKNOWN_TOKEN_OFFSET);
    }

    #[test]
    fn refuses_what_lmcaches_consumer_refuses() {
        for (from, to) in [
            (r#""seq":1"#, r#""seq":0"#),
            (r#""instance_id":"a""#, r#""instance_id":"""#),
            (r#""backend":"dram""#, r#""backend":"""#),
            (r#""tier":"l1""#, r#""tier":"all""#),
            (r#""tier":"l1""#, r#""tier":"l3""#),
            (r#""event_type":"store""#, r#""event_type":"config""#),
            ("0aff", "0ag"),
            (r#""model_name":"m""#, r#""model_name":"m@x""#),
            (r#""cache_salt":"""#, r#""cache_salt":"a/b""#),
            (r#""token_offset":0"#, r#""token_offset":-2"#),
        ] {
            let bad = STORE.replace(from, to);
            assert_ne!(bad, STORE, "{from}");
            assert!(decode(bad.as_bytes()).is_err(), "{to} accepted");
        }
        assert!(decode(b"not json").is_err());
        // An access batch needs no backend.
        let access = STORE.replace(r#""event_type":"store""#, r#""event_type":"access""#).replace("dram", "");
        assert!(decode(access.as_bytes()).is_ok());
    }
}

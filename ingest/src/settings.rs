//! The settings that decide applied state: one value, part of the log's identity.
//!
//! Two replicas that apply the same log prefix reach the same state only if they apply it with
//! the same placement TTL, capacities, lock chunking, per-record limit, expiry interval, digest
//! interval and log-time step limit. So these travel together: every checkpoint records them,
//! the peer `Digests` reply carries them, and restore, bootstrap, audit and repair all compare
//! them with [`crate::identity::check_compatible`] before trusting another replica's state.
//! Settings that do not change applied state (ports, intervals of timers, history lengths)
//! are not here.

use prefixlog_engine::EngineConfig;
use std::fmt;
use std::time::Duration;

/// The state-deciding settings of a log. Build with [`StateSettings::default`] and override
/// fields explicitly; never fill them from another struct's defaults at a call site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateSettings {
    /// Inferred (placement) blocks not placed again within this much log time expire.
    pub placement_ttl_ms: u64,
    /// Per-holder bound for event-fed holders (a safety net for lost removal events).
    pub holder_capacity: u32,
    /// Per-holder bound for inferred (placement-only) holders.
    pub inferred_capacity: u32,
    /// The engine applies a store or removal in chunks of this many blocks (each chunk is its
    /// own operation record, so it decides eviction order).
    pub max_blocks_per_lock: u32,
    /// Records carrying more blocks than this are refused (`too_many_blocks`).
    pub max_blocks_per_record: u32,
    /// Placement expiry runs when a partition's log time enters a new interval of this length.
    pub expiry_interval_ms: u64,
    /// A partition records a digest point every this many offsets.
    pub digest_interval: u64,
    /// One record may move its partition's log time forward by at most this much (a producer
    /// with a clock far in the future must not expire every placement at once and then freeze
    /// expiry). Records whose timestamp was cut are counted (`log_time_clamped`).
    pub max_log_time_step_ms: u64,
}

impl Default for StateSettings {
    fn default() -> Self {
        Self {
            placement_ttl_ms: 120_000,
            holder_capacity: 1 << 22,
            inferred_capacity: 1 << 16,
            max_blocks_per_lock: 32,
            max_blocks_per_record: 16_384,
            expiry_interval_ms: 1_000,
            digest_interval: 1_000,
            max_log_time_step_ms: 60_000,
        }
    }
}

/// The encoding version of [`StateSettings::encode`].
const ENCODING: u8 = 1;
const ENCODED_LEN: usize = 1 + 8 * 8;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    #[error("state settings: {len} bytes, expected {ENCODED_LEN}")]
    Length { len: usize },
    #[error("state settings: encoding version {0}, this build reads {ENCODING}")]
    Version(u8),
    #[error("state settings: {field} must be at least 1")]
    Zero { field: &'static str },
}

impl StateSettings {
    /// The engine configuration these settings give for a log of `partitions` partitions.
    pub fn engine_config(&self, partitions: u32) -> EngineConfig {
        EngineConfig {
            holder_capacity: self.holder_capacity,
            inferred_capacity: self.inferred_capacity,
            placement_ttl_ms: self.placement_ttl_ms,
            partitions,
            max_blocks_per_lock: self.max_blocks_per_lock as usize,
            ..EngineConfig::default()
        }
    }

    pub fn placement_ttl(&self) -> Duration {
        Duration::from_millis(self.placement_ttl_ms)
    }

    /// Refuses values that would make the applier divide by zero or never record a point.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let zero = |field| Err(SettingsError::Zero { field });
        if self.max_blocks_per_lock == 0 {
            return zero("max_blocks_per_lock");
        }
        if self.expiry_interval_ms == 0 {
            return zero("expiry_interval_ms");
        }
        if self.digest_interval == 0 {
            return zero("digest_interval");
        }
        if self.max_log_time_step_ms == 0 {
            return zero("max_log_time_step_ms");
        }
        Ok(())
    }

    /// Fixed-width little-endian encoding (checkpoints, the peer `Digests` reply).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.push(ENCODING);
        for v in self.fields() {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Self, SettingsError> {
        if buf.len() != ENCODED_LEN {
            return Err(SettingsError::Length { len: buf.len() });
        }
        if buf[0] != ENCODING {
            return Err(SettingsError::Version(buf[0]));
        }
        let f = |i: usize| u64::from_le_bytes(buf[1 + 8 * i..9 + 8 * i].try_into().expect("8 bytes"));
        let narrow = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let s = Self {
            placement_ttl_ms: f(0),
            holder_capacity: narrow(f(1)),
            inferred_capacity: narrow(f(2)),
            max_blocks_per_lock: narrow(f(3)),
            max_blocks_per_record: narrow(f(4)),
            expiry_interval_ms: f(5),
            digest_interval: f(6),
            max_log_time_step_ms: f(7),
        };
        s.validate()?;
        Ok(s)
    }

    /// A short stable hash of the encoding, for logs and metrics labels.
    pub fn fingerprint(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&self.encode())
    }

    /// Every field, in encoding order.
    fn fields(&self) -> [u64; 8] {
        [
            self.placement_ttl_ms,
            u64::from(self.holder_capacity),
            u64::from(self.inferred_capacity),
            u64::from(self.max_blocks_per_lock),
            u64::from(self.max_blocks_per_record),
            self.expiry_interval_ms,
            self.digest_interval,
            self.max_log_time_step_ms,
        ]
    }

    /// `name: ours vs theirs` for every field that differs (error messages).
    pub fn differences(&self, other: &Self) -> Vec<String> {
        const NAMES: [&str; 8] = [
            "placement_ttl_ms",
            "holder_capacity",
            "inferred_capacity",
            "max_blocks_per_lock",
            "max_blocks_per_record",
            "expiry_interval_ms",
            "digest_interval",
            "max_log_time_step_ms",
        ];
        NAMES
            .iter()
            .zip(self.fields().iter().zip(other.fields()))
            .filter(|(_, (a, b))| *a != b)
            .map(|(n, (a, b))| format!("{n} {a} vs {b}"))
            .collect()
    }
}

impl fmt::Display for StateSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "placement_ttl {}ms, holder_capacity {}, inferred_capacity {}, max_blocks_per_lock {}, \
             max_blocks_per_record {}, expiry_interval {}ms, digest_interval {}, max_log_time_step {}ms",
            self.placement_ttl_ms,
            self.holder_capacity,
            self.inferred_capacity,
            self.max_blocks_per_lock,
            self.max_blocks_per_record,
            self.expiry_interval_ms,
            self.digest_interval,
            self.max_log_time_step_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_refuses_garbage() {
        let s = StateSettings { placement_ttl_ms: 5, holder_capacity: 7, ..Default::default() };
        assert_eq!(StateSettings::decode(&s.encode()), Ok(s));
        assert_eq!(StateSettings::decode(&[1, 2, 3]), Err(SettingsError::Length { len: 3 }));
        let mut v = s.encode();
        v[0] = 9;
        assert_eq!(StateSettings::decode(&v), Err(SettingsError::Version(9)));
        let zero = StateSettings { digest_interval: 0, ..s };
        assert_eq!(
            StateSettings::decode(&zero.encode()),
            Err(SettingsError::Zero { field: "digest_interval" })
        );
    }

    #[test]
    fn differences_name_the_fields() {
        let a = StateSettings::default();
        let b = StateSettings { placement_ttl_ms: 1, digest_interval: 16, ..a };
        assert_eq!(a.differences(&b), vec!["placement_ttl_ms 120000 vs 1", "digest_interval 1000 vs 16"]);
        assert!(a.differences(&a).is_empty());
        assert_ne!(a.fingerprint(), b.fingerprint());
    }
}

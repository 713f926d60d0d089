//! The settings that decide applied state: one value, part of the log's identity.
//!
//! Two replicas that apply the same log prefix reach the same state only if they apply it with
//! the same placement TTL, capacities, lock chunking, per-record limit, expiry interval, digest
//! interval and log-time step limit. So these travel together: every checkpoint records them,
//! the peer `Digests` reply carries them, and restore, bootstrap, audit and repair all compare
//! them with [`crate::identity::check_compatible`] before trusting another replica's state.
//! Settings that do not change applied state (ports, intervals of timers, history lengths)
//! are not here.
//!
//! The limits on what records may create (keyspaces, feeds, lanes, holders, workers, metadata
//! and name sizes; `crate::limits`) are here too: whether a record is refused changes the
//! state. Every limit counts within one partition, never across partitions, so a refusal
//! depends only on that partition's records (not on how partitions interleave, nor on which
//! partitions a replica owns). A replica's state is bounded by its owned partitions times
//! these limits.

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
    /// Keyspaces a partition's feeds and holders may be in (`too_many_keyspaces`).
    pub max_keyspaces_per_partition: u32,
    /// Feeds (keyspace × worker × dp rank) per partition (`too_many_feeds`).
    pub max_feeds_per_partition: u32,
    /// Lanes one feed may name, in events or lane metadata (`too_many_lanes`).
    pub max_lanes_per_feed: u32,
    /// Holders (keyspace × worker × dp rank × lane) per partition, fed and inferred
    /// (`too_many_holders`).
    pub max_holders_per_partition: u32,
    /// Workers announced by `WorkerAdded` per partition (`too_many_workers`).
    pub max_workers_per_partition: u32,
    /// Size of one worker's metadata: every key and value, plus [`METADATA_ENTRY_BYTES`] per
    /// entry for its bookkeeping (`metadata_too_large`).
    pub max_worker_metadata_bytes: u32,
    /// The longest model name or lane kind a record may carry, in bytes (`name_too_long`).
    pub max_name_bytes: u32,
}

/// What one metadata entry counts for besides its key and value
/// ([`StateSettings::max_worker_metadata_bytes`]): about what storing it costs beyond its text.
pub const METADATA_ENTRY_BYTES: u32 = 32;

impl Default for StateSettings {
    /// The limits are sized for real fleets with room to spare: 2,048 workers with 8 dp ranks,
    /// a few lanes and models, over 16-64 partitions (10,000 workers on paper). A partition
    /// then sees ~130 workers (625 at 10,000), ~1,000 feeds (one model: worker × dp rank; 5,000
    /// at 10,000 workers) and a few holders per feed. The defaults take a whole 2,048 × 8 fleet
    /// in one partition (16,384 feeds) with four lanes each (65,536 holders), and 4,096
    /// workers. What each limit costs at most is in the README ("Bounded state").
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
            // A keyspace is a model × block size × hash scheme: a fleet serves a few.
            max_keyspaces_per_partition: 64,
            max_feeds_per_partition: 16_384,
            // Hybrid models keep a few cache groups (full attention, sliding window, state).
            max_lanes_per_feed: 16,
            max_holders_per_partition: 65_536,
            max_workers_per_partition: 4_096,
            // Pod name, endpoint, model, zone and a few labels take a few hundred bytes.
            max_worker_metadata_bytes: 4_096,
            // Model ids ("org/Model-Name-70B-Instruct-FP8") are well under 100 bytes.
            max_name_bytes: 256,
        }
    }
}

/// The encoding version of [`StateSettings::encode`]: 2 added the limits. Version 1 is still
/// read, as the settings of a state applied before limits existed: every limit `u32::MAX`, a
/// value reserved for that (refused in any other settings), because those builds applied the
/// log differently in more than the limits (keyspaces for removals and clears, holders for
/// stores under a missing parent). Such settings never equal a configured build's, so an
/// upgraded replica replays rather than takes those states for its own.
const ENCODING: u8 = 2;
const FIELDS: usize = 15;
const FIELDS_V1: usize = 8;
const fn encoded_len(fields: usize) -> usize {
    1 + 8 * fields
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    #[error("state settings: {len} bytes, expected {expected} for encoding version {version}")]
    Length { len: usize, expected: usize, version: u8 },
    #[error("state settings: encoding version {0}, this build reads 1 and {ENCODING}")]
    Version(u8),
    #[error("state settings: {field} must be at least 1")]
    Zero { field: &'static str },
    #[error(
        "state settings: {field} {}: that value stands for states applied before limits existed; \
         use a smaller one",
        u32::MAX
    )]
    Reserved { field: &'static str },
}

impl StateSettings {
    /// `self` as applied before limits existed: what a version-1 encoding describes (module
    /// doc of the encoding: every limit `u32::MAX`).
    pub const fn without_limits(self) -> Self {
        Self {
            max_keyspaces_per_partition: u32::MAX,
            max_feeds_per_partition: u32::MAX,
            max_lanes_per_feed: u32::MAX,
            max_holders_per_partition: u32::MAX,
            max_workers_per_partition: u32::MAX,
            max_worker_metadata_bytes: u32::MAX,
            max_name_bytes: u32::MAX,
            ..self
        }
    }

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

    /// Whether these are the settings of a state applied before limits existed.
    pub fn before_limits(&self) -> bool {
        self.fields()[FIELDS_V1..].iter().all(|&v| v == u64::from(u32::MAX))
    }

    /// Refuses values that would make the applier divide by zero or never record a point, a
    /// limit of 0, and the reserved limit `u32::MAX` (unless every limit has it: the settings of
    /// a state applied before limits, read from a version-1 encoding).
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
        // A limit of 0 would refuse every record of its kind: a log nobody could use.
        if let Some(i) = (FIELDS_V1..FIELDS).find(|&i| self.fields()[i] == 0) {
            return zero(NAMES[i]);
        }
        if !self.before_limits() {
            if let Some(i) = (FIELDS_V1..FIELDS).find(|&i| self.fields()[i] == u64::from(u32::MAX)) {
                return Err(SettingsError::Reserved { field: NAMES[i] });
            }
        }
        Ok(())
    }

    /// Fixed-width little-endian encoding (checkpoints, the peer `Digests` reply): version 2,
    /// or version 1 for the settings of a state applied before limits (as it was read).
    pub fn encode(&self) -> Vec<u8> {
        let (version, fields) = if self.before_limits() { (1, FIELDS_V1) } else { (ENCODING, FIELDS) };
        let mut out = Vec::with_capacity(encoded_len(fields));
        out.push(version);
        for v in &self.fields()[..fields] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Reads version 2, and version 1 as the settings it was applied with (before limits), so a
    /// checkpoint of an older build compares as applied with other settings: refused, or
    /// replayed (`--replay-on-settings-change`), never taken for a state of this build.
    pub fn decode(buf: &[u8]) -> Result<Self, SettingsError> {
        let version = *buf.first().ok_or(SettingsError::Length { len: 0, expected: 1, version: 0 })?;
        let fields = match version {
            1 => FIELDS_V1,
            ENCODING => FIELDS,
            v => return Err(SettingsError::Version(v)),
        };
        if buf.len() != encoded_len(fields) {
            return Err(SettingsError::Length { len: buf.len(), expected: encoded_len(fields), version });
        }
        let f = |i: usize| u64::from_le_bytes(buf[1 + 8 * i..9 + 8 * i].try_into().expect("8 bytes"));
        let narrow = |i: usize| u32::try_from(f(i)).unwrap_or(u32::MAX);
        let limit = |i: usize| if i < fields { narrow(i) } else { u32::MAX };
        let s = Self {
            placement_ttl_ms: f(0),
            holder_capacity: narrow(1),
            inferred_capacity: narrow(2),
            max_blocks_per_lock: narrow(3),
            max_blocks_per_record: narrow(4),
            expiry_interval_ms: f(5),
            digest_interval: f(6),
            max_log_time_step_ms: f(7),
            max_keyspaces_per_partition: limit(8),
            max_feeds_per_partition: limit(9),
            max_lanes_per_feed: limit(10),
            max_holders_per_partition: limit(11),
            max_workers_per_partition: limit(12),
            max_worker_metadata_bytes: limit(13),
            max_name_bytes: limit(14),
        };
        s.validate()?;
        Ok(s)
    }

    /// A short stable hash of the encoding, for logs and metrics labels.
    pub fn fingerprint(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&self.encode())
    }

    /// Every field, in encoding order ([`NAMES`]).
    fn fields(&self) -> [u64; FIELDS] {
        [
            self.placement_ttl_ms,
            u64::from(self.holder_capacity),
            u64::from(self.inferred_capacity),
            u64::from(self.max_blocks_per_lock),
            u64::from(self.max_blocks_per_record),
            self.expiry_interval_ms,
            self.digest_interval,
            self.max_log_time_step_ms,
            u64::from(self.max_keyspaces_per_partition),
            u64::from(self.max_feeds_per_partition),
            u64::from(self.max_lanes_per_feed),
            u64::from(self.max_holders_per_partition),
            u64::from(self.max_workers_per_partition),
            u64::from(self.max_worker_metadata_bytes),
            u64::from(self.max_name_bytes),
        ]
    }

    /// `name: ours vs theirs` for every field that differs (error messages).
    pub fn differences(&self, other: &Self) -> Vec<String> {
        let show = |i: usize, v: u64| {
            if i >= FIELDS_V1 && v == u64::from(u32::MAX) {
                "none (applied before limits)".to_string()
            } else {
                v.to_string()
            }
        };
        (0..FIELDS)
            .map(|i| (i, self.fields()[i], other.fields()[i]))
            .filter(|(_, a, b)| a != b)
            .map(|(i, a, b)| format!("{} {} vs {}", NAMES[i], show(i, a), show(i, b)))
            .collect()
    }
}

/// The field names, in encoding order.
const NAMES: [&str; FIELDS] = [
    "placement_ttl_ms",
    "holder_capacity",
    "inferred_capacity",
    "max_blocks_per_lock",
    "max_blocks_per_record",
    "expiry_interval_ms",
    "digest_interval",
    "max_log_time_step_ms",
    "max_keyspaces_per_partition",
    "max_feeds_per_partition",
    "max_lanes_per_feed",
    "max_holders_per_partition",
    "max_workers_per_partition",
    "max_worker_metadata_bytes",
    "max_name_bytes",
];

impl fmt::Display for StateSettings {
    /// `name value` for every field, in encoding order; an unlimited limit reads "unlimited".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, v)) in NAMES.iter().zip(self.fields()).enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            match v {
                _ if i >= FIELDS_V1 && v == u64::from(u32::MAX) => {
                    write!(f, "{sep}{name} none (applied before limits)")?
                }
                _ if name.ends_with("_ms") => write!(f, "{sep}{} {v}ms", name.trim_end_matches("_ms"))?,
                _ => write!(f, "{sep}{name} {v}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_refuses_garbage() {
        let s = StateSettings {
            placement_ttl_ms: 5,
            holder_capacity: 7,
            max_lanes_per_feed: 3,
            ..Default::default()
        };
        assert_eq!(StateSettings::decode(&s.encode()), Ok(s));
        assert_eq!(
            StateSettings::decode(&[1, 2, 3]),
            Err(SettingsError::Length { len: 3, expected: 65, version: 1 })
        );
        assert!(matches!(StateSettings::decode(&[]), Err(SettingsError::Length { len: 0, .. })));
        let mut v = s.encode();
        v[0] = 9;
        assert_eq!(StateSettings::decode(&v), Err(SettingsError::Version(9)));
        let none = StateSettings { max_name_bytes: 0, ..s };
        assert_eq!(
            StateSettings::decode(&none.encode()),
            Err(SettingsError::Zero { field: "max_name_bytes" })
        );
        let zero = StateSettings { digest_interval: 0, ..s };
        assert_eq!(
            StateSettings::decode(&zero.encode()),
            Err(SettingsError::Zero { field: "digest_interval" })
        );
    }

    /// A version-1 encoding (before limits; bytes as that build wrote them) reads as the
    /// settings it was applied with: before limits. It differs from any settings a build can
    /// be configured with (the limits' reserved value), so a checkpoint of that build is
    /// refused or replayed, never taken for a state of this one.
    #[test]
    fn version_one_reads_as_before_limits() {
        let mut v1 = vec![1u8];
        for x in [120_000u64, 1 << 22, 1 << 16, 32, 16_384, 1_000, 1_000, 60_000] {
            v1.extend_from_slice(&x.to_le_bytes());
        }
        let old = StateSettings::decode(&v1).expect("version 1 reads");
        assert_eq!(old, StateSettings::default().without_limits());
        let diffs = StateSettings::default().differences(&old);
        assert_eq!(diffs.len(), 7, "{diffs:?}");
        assert_eq!(diffs[0], "max_keyspaces_per_partition 64 vs none (applied before limits)");
        assert!(old.to_string().contains("max_name_bytes none (applied before limits)"), "{old}");
        assert_eq!(old.encode(), v1, "written back as it was read");
        // The reserved value, in settings a build would apply with: refused.
        let max = StateSettings { max_lanes_per_feed: u32::MAX, ..StateSettings::default() };
        assert_eq!(max.validate(), Err(SettingsError::Reserved { field: "max_lanes_per_feed" }));
        assert_eq!(
            StateSettings::decode(&max.encode()),
            Err(SettingsError::Reserved { field: "max_lanes_per_feed" })
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

//! Which checkpoint formats this build writes and reads: below the meta that records a
//! checkpoint's format and the errors that refuse one, so neither needs the other for it.

/// 2: the identity carries the covered partitions and the state settings; partition state
/// carries announced workers and the log-gap / clamp / invalid-store counters.
/// 3: keyspaces are engine images (the in-memory layout, restored by bulk copies) instead of
/// columnar dumps rebuilt node by node.
/// 4: the meta carries each partition's record fingerprint (the record before its offset), so
/// a restart tells this log from a recreated one that has grown past the checkpoint.
/// 5: the partition value also carries every partition's recorded digest points, so a restarted
/// replica compares with its peers as far back as before the restart.
/// 6: metas and partition values are serde types encoded with postcard ([`crate::codec`])
/// instead of hand-laid fields; keyspaces are still engine images. Formats 2 to 5 are read by
/// [`crate::upgrade`].
pub const FORMAT_VERSION: u32 = 6;

/// Formats this build restores: its own, and formats 2 to 5 (so that an upgraded replica
/// restores its own and its peers' checkpoints rather than needing the whole log; formats 2
/// and 3 have no fingerprints, so only their offsets are checked against the log; formats
/// before 5 have no digest points, so anti-entropy starts comparing at the next point).
pub const READABLE_FORMATS: [u32; 5] = [2, 3, 4, 5, FORMAT_VERSION];

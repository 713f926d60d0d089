//! Which log a state belongs to, and the one rule that says whether another replica's state
//! (a checkpoint on disk, a peer's checkpoint, a peer's digests) can stand for ours.
//!
//! Restore, bootstrap, audit, repair and anti-entropy all call [`check_compatible`]: the same
//! cluster, topic and partition count, the same [`StateSettings`], and the partitions we need
//! all present. Offsets are checked separately (`prefixlog_ingest::continuity`), against the log as it is
//! now.

use crate::settings::StateSettings;

/// The log a state was applied from, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogIdentity {
    /// Kafka cluster id (each run of the embedded broker has a new one).
    pub cluster_id: String,
    pub topic: String,
    /// Partitions of the topic.
    pub partitions: u32,
    /// Partitions whose state this covers, ascending.
    pub owned: Vec<u32>,
    pub settings: StateSettings,
}

/// Why another state cannot stand for ours.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Incompatible {
    #[error("it is of topic {theirs:?}, this replica reads {ours:?}")]
    Topic { ours: String, theirs: String },
    #[error("it has {theirs} partitions, the topic has {ours}")]
    PartitionCount { ours: u32, theirs: u32 },
    #[error(
        "it is of Kafka cluster {theirs:?}, the broker is cluster {ours:?} (a recreated cluster, or a \
         previous run of the embedded broker)"
    )]
    Cluster { ours: String, theirs: String },
    #[error(
        "its state-deciding settings differ ({}): the same log applied with other settings is another \
         state (start with the same settings, or replay the log)",
        differences.join(", ")
    )]
    Settings { differences: Vec<String> },
    #[error("it does not cover partitions {missing:?} (it covers {covered:?})")]
    MissingPartitions { missing: Vec<u32>, covered: Vec<u32> },
}

/// Whether `theirs` can provide the state of partitions `need` for a replica of `ours`. A
/// state covering more partitions than needed is fine (the rest is left out); one covering
/// fewer is not.
pub fn check_compatible(ours: &LogIdentity, theirs: &LogIdentity, need: &[u32]) -> Result<(), Incompatible> {
    if ours.topic != theirs.topic {
        return Err(Incompatible::Topic { ours: ours.topic.clone(), theirs: theirs.topic.clone() });
    }
    if ours.partitions != theirs.partitions {
        return Err(Incompatible::PartitionCount { ours: ours.partitions, theirs: theirs.partitions });
    }
    if ours.cluster_id != theirs.cluster_id {
        return Err(Incompatible::Cluster {
            ours: ours.cluster_id.clone(),
            theirs: theirs.cluster_id.clone(),
        });
    }
    let differences = ours.settings.differences(&theirs.settings);
    if !differences.is_empty() {
        return Err(Incompatible::Settings { differences });
    }
    let missing: Vec<u32> = need.iter().copied().filter(|p| theirs.owned.binary_search(p).is_err()).collect();
    if !missing.is_empty() {
        return Err(Incompatible::MissingPartitions { missing, covered: theirs.owned.clone() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(owned: Vec<u32>) -> LogIdentity {
        LogIdentity {
            cluster_id: "c".into(),
            topic: "t".into(),
            partitions: 4,
            owned,
            settings: StateSettings::default(),
        }
    }

    #[test]
    fn the_rule() {
        let ours = id(vec![0, 2]);
        assert_eq!(check_compatible(&ours, &id(vec![0, 1, 2, 3]), &[0, 2]), Ok(()));
        assert_eq!(
            check_compatible(&ours, &id(vec![0, 1]), &[0, 2]),
            Err(Incompatible::MissingPartitions { missing: vec![2], covered: vec![0, 1] })
        );
        let other = LogIdentity { cluster_id: "d".into(), ..id(vec![0, 2]) };
        assert!(matches!(check_compatible(&ours, &other, &[0]), Err(Incompatible::Cluster { .. })));
        let ttl = LogIdentity {
            settings: StateSettings { placement_ttl_ms: 1, ..Default::default() },
            ..id(vec![0, 2])
        };
        let err = check_compatible(&ours, &ttl, &[0]).unwrap_err();
        assert_eq!(err, Incompatible::Settings { differences: vec!["placement_ttl_ms 120000 vs 1".into()] });
        assert!(err.to_string().contains("placement_ttl_ms 120000 vs 1"));
    }
}

//! Self-check and repair against an in-memory log (`prefixlog_state::memory_log`): no broker.
//! A replica whose partition applied a record the log does not hold finds it by rebuilding the
//! partition from the log, and gets the log's state swapped in; a partition that agrees with
//! its log is left alone; a log whose head retention dropped, with no checkpoint, cannot stand
//! for a rebuild; concurrent repairs of one partition run once.

use prefixlog_engine::{partition_of, KeyspaceId};
use prefixlog_peer::repair::{check_and_repair, rebuild_and_swap, self_check, SelfCheck};
use prefixlog_peer::{RepairContext, RepairError, RepairOutcome};
use prefixlog_state::memory_log::{MemoryLog, MemoryReplica};
use prefixlog_state::record::encode_kv_events;
use prefixlog_state::BlockHashes;
use prefixlog_state::{Applier, KvOp, LiveState, LogIdentity, LogSource, StateSettings, Tier, Until};
use std::sync::Arc;

const P: u32 = 2;

fn identity() -> LogIdentity {
    LogIdentity {
        cluster_id: "memory".into(),
        topic: "memory".into(),
        partitions: P,
        owned: vec![0, 1],
        settings: StateSettings::default(),
    }
}

/// Worker `w`'s `seq`-th batch: four blocks chained on the previous batch's last one; `salt`
/// changes the blocks (a record the log does not hold).
fn batch(w: u64, seq: u64, salt: u64) -> Vec<u8> {
    let base = w << 32 | seq << 8 | salt << 4;
    let blocks: Vec<BlockHashes> =
        (0..4).map(|j| (base + j, base + j + 1000)).map(BlockHashes::from).collect();
    let parent = (seq > 1).then(|| w << 32 | (seq - 1) << 8 | 3);
    let ks = KeyspaceId::new("m", 16, 1);
    encode_kv_events(
        &ks,
        w,
        0,
        1,
        seq,
        false,
        &[KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: parent, blocks }],
    )
}

/// The log: 6 workers × 5 batches.
fn log() -> Arc<MemoryLog> {
    let log = Arc::new(MemoryLog::new(P, StateSettings::default()));
    for seq in 1..=5 {
        for w in 0..6 {
            log.push(w, seq * 10, batch(w, seq, 0));
        }
    }
    log
}

fn everything(log: &MemoryLog) -> Until {
    Until::Offsets(log.ends().iter().enumerate().map(|(p, &e)| (p as u32, e)).collect())
}

/// The state of the whole log.
fn truth(log: &MemoryLog) -> Applier {
    let mut a = Applier::new(P, StateSettings::default());
    log.apply(&mut a, &everything(log), Default::default()).unwrap();
    a
}

/// The state of the log except that worker `w`'s third batch was another one.
fn diverged(log: &MemoryLog, w: u64) -> Applier {
    let other = MemoryLog::new(P, StateSettings::default());
    for seq in 1..=5 {
        for v in 0..6 {
            other.push(v, seq * 10, batch(v, seq, u64::from(v == w && seq == 3)));
        }
    }
    assert_eq!(other.ends(), log.ends());
    truth(&other)
}

fn ctx(log: &Arc<MemoryLog>) -> RepairContext {
    RepairContext::new(log.clone(), identity(), None)
}

#[tokio::test]
async fn a_diverged_partition_is_rebuilt_from_the_log_and_swapped_in() {
    let log = log();
    let bad = partition_of(2, P);
    let good = 1 - bad;
    let live = MemoryReplica::new(diverged(&log, 2));
    let want = truth(&log);
    assert_ne!(live.applier().lock().partition_digest(bad), want.partition_digest(bad));

    let end = log.ends()[bad as usize];
    let recorded = live.applier().lock().partition_digest(bad);
    let outcome = check_and_repair(&ctx(&log), &live, bad, end, recorded, None).await.unwrap();
    assert_eq!(outcome, RepairOutcome::Repaired { from_checkpoint: None, swapped_at: end });
    assert_eq!(live.applier().lock().partition_digest(bad), want.partition_digest(bad));

    // The other partition agrees with the log: the self-check says so and nothing is swapped.
    let end = log.ends()[good as usize];
    let recorded = live.applier().lock().partition_digest(good);
    let outcome = check_and_repair(&ctx(&log), &live, good, end, recorded, None).await.unwrap();
    assert_eq!(outcome, RepairOutcome::Consistent);
    let now = live.applier().lock();
    assert_eq!(
        (0..P).map(|p| now.partition_digest(p)).collect::<Vec<_>>(),
        (0..P).map(|p| want.partition_digest(p)).collect::<Vec<_>>()
    );
}

#[test]
fn the_self_check_rebuilds_the_partition_at_the_point() {
    let log = log();
    let p = partition_of(4, P);
    let at = 7;
    let mut want = Applier::new(P, StateSettings::default());
    log.apply(&mut want, &Until::Offsets([(p, at)].into()), Default::default()).unwrap();
    match self_check(&ctx(&log), p, at, want.partition_digest(p) ^ 1, None).unwrap() {
        SelfCheck::Diverged { rebuilt, from_checkpoint: None } => {
            assert_eq!(rebuilt.partition(p).next_offset, at);
            assert_eq!(rebuilt.partition_digest(p), want.partition_digest(p));
        }
        _ => panic!("a recorded digest the log does not produce is a divergence"),
    }
    assert!(matches!(
        self_check(&ctx(&log), p, at, want.partition_digest(p), None).unwrap(),
        SelfCheck::Consistent
    ));
}

#[test]
fn a_log_whose_head_is_gone_cannot_rebuild_without_a_checkpoint() {
    let log = log();
    log.drop_before(0, 4);
    let err = self_check(&ctx(&log), 0, 6, 0, None).err().expect("no base to rebuild from");
    assert!(matches!(err, RepairError::NoBase { partition: 0, log_start: 4, .. }), "{err}");
}

#[test]
fn a_point_beyond_the_log_is_an_error_not_a_partial_rebuild() {
    let log = log();
    let end = log.ends()[1];
    let err = self_check(&ctx(&log), 1, end + 1, 0, None).err().expect("beyond the end");
    assert!(matches!(err, RepairError::ApplyLog { partition: 1, .. }), "{err}");
}

#[tokio::test]
async fn one_repair_per_partition_at_a_time() {
    let log = log();
    let live = MemoryReplica::new(diverged(&log, 3));
    let p = partition_of(3, P);
    let c = ctx(&log);
    let held = c.gate.enter(p).expect("free");
    assert_eq!(rebuild_and_swap(&c, &live, p).await.unwrap(), RepairOutcome::AlreadyRunning);
    drop(held);
    assert!(matches!(rebuild_and_swap(&c, &live, p).await.unwrap(), RepairOutcome::Repaired { .. }));
    assert_eq!(live.applier().lock().partition_digest(p), truth(&log).partition_digest(p));
}

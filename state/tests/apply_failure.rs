//! A record whose apply panics (the `testing` hook stands for a bug in the apply path) does not
//! count as applied: the partition's next offset stays at it, so a checkpoint of the state
//! before it resumes at it; the applier keeps the failure for the checkpointer to see.

use prefixlog_engine::KeyspaceId;
use prefixlog_state::record::{encode_kv_events, worker_for_partition};
use prefixlog_state::BlockHashes;
use prefixlog_state::{testing, Applier, ApplyFailure, KvOp, Outcome, StateSettings, Tier};
use std::panic::{catch_unwind, AssertUnwindSafe};

const P: u32 = 2;

fn batch(w: u64, seq: u64) -> Vec<u8> {
    let ks = KeyspaceId::new("m", 16, 1);
    let ops = [KvOp::Stored {
        tier: Tier::Gpu,
        lane: 0,
        parent_ext: None,
        blocks: [(w << 8 | seq, seq)].map(BlockHashes::from).to_vec(),
    }];
    encode_kv_events(&ks, w, 0, 1, seq, false, &ops)
}

#[test]
fn a_panicking_record_leaves_its_partition_at_that_offset() {
    let marker = b"apply-failure-test:unit";
    testing::panic_on_value(marker);
    let mut a = Applier::new(P, StateSettings::default());
    let (w0, w1) = (worker_for_partition(0, P), worker_for_partition(1, P));
    assert_eq!(a.apply(0, 0, 1_000, Some(&batch(w0, 1))), Ok(Outcome::Applied));
    let poison = [&marker[..], b" and the rest of the record"].concat();
    let r = catch_unwind(AssertUnwindSafe(|| a.apply(0, 1, 2_000, Some(&poison))));
    assert!(r.is_err(), "the hook panics");
    assert_eq!(a.partition(0).next_offset, 1, "the failed record is not applied: resume at it");
    assert_eq!(
        a.partition(0).last_mark,
        prefixlog_state::partition_state::record_mark(1_000, Some(&batch(w0, 1)))
    );
    assert!(a.failure().is_none(), "marking the failure is the caller's (the ingest thread's)");
    a.mark_failed(ApplyFailure { partition: 0, offset: 1, message: "boom".into() });
    a.mark_failed(ApplyFailure { partition: 1, offset: 9, message: "later".into() });
    assert_eq!(a.failure().map(|f| (f.partition, f.offset)), Some((0, 1)), "the first failure is kept");
    // The other partition applies on.
    assert_eq!(a.apply(1, 0, 3_000, Some(&batch(w1, 1))), Ok(Outcome::Applied));
    assert_eq!(a.offsets(), vec![1, 1]);
}

//! The two-copy keyspace (`KeyspaceCell::paired`, `serve --query-copy`): a query is answered
//! while a write holds the copy it writes, from the state before that write, and from the
//! state after it once the writer has moved on to the other copy. With one copy the same
//! query would wait for the write (here: forever, since the write waits for the query).

use prefixlog_engine::{EngineConfig, HolderKey, Keyspace, KeyspaceCell, KeyspaceId, MatchOptions};
use std::sync::mpsc;
use std::time::Duration;

fn depth_of_worker_1(cell: &KeyspaceCell) -> u32 {
    let answer = cell.read().match_chain(&[1, 2, 3], &MatchOptions::default());
    answer.iter().find(|m| m.holder.worker == 1).map_or(0, |m| m.depth)
}

#[test]
fn a_query_is_answered_while_a_write_holds_its_copy() {
    let cell = KeyspaceCell::paired(Keyspace::new(KeyspaceId::new("m", 16, 1), EngineConfig::default()));
    let h = HolderKey::new(1, 0, 0);
    let mut seen = Vec::new();
    std::thread::scope(|s| {
        let stored = cell.write(|k| {
            // The writer holds this copy's write lock here. A query on another thread must
            // still be answered: ask one and wait for it (bounded, so a regression fails
            // rather than hangs).
            let (tx, rx) = mpsc::channel();
            let cell = &cell;
            s.spawn(move || tx.send(depth_of_worker_1(cell)).unwrap());
            let depth = rx.recv_timeout(Duration::from_secs(60)).expect("a query waited on the writer");
            seen.push(depth);
            k.store(h, None, &[(11, 1), (12, 2), (13, 3)], 1)
        });
        assert_eq!(stored, Ok(3));
    });
    // First application: the query read the copy not yet written (depth 0); second: the
    // written copy had become the one queries read (depth 3).
    assert_eq!(seen, vec![0, 3]);
    assert_eq!(depth_of_worker_1(&cell), 3);
}

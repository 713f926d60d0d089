//! `dynamo-kv-router = "=1.6.1"`: the single-threaded `RadixTree`, driven as its tests do:
//! `apply_event(RouterEvent::new(worker_id, KvCacheEvent { event_id, data, dp_rank: 0 }))` with
//! `KvCacheEventData::Stored(KvCacheStoreData { parent_hash, start_position: None, blocks })` /
//! `KvCacheEventData::Removed(KvCacheRemoveData { block_hashes })`, and
//! `find_matches(Vec<LocalBlockHash>, early_exit = false).scores`.
//!
//! Event construction (one `Vec<KvCacheStoredBlockData>` per stored event) happens inside the
//! timed call: it is the API's input format, what a consumer deserializes into.

use crate::index::Index;
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, OverlapScores, RouterEvent,
};
use dynamo_kv_router::RadixTree;
use prefixlog_workload::BlockHashes;

/// Builds the Dynamo events both Dynamo adapters feed (worker id = workload worker, dp rank 0).
#[derive(Default)]
pub struct EventMaker {
    next_id: u64,
}

impl EventMaker {
    fn wrap(&mut self, worker: u32, data: KvCacheEventData) -> RouterEvent {
        self.next_id += 1;
        RouterEvent::new(worker as u64, KvCacheEvent { event_id: self.next_id, data, dp_rank: 0 })
    }

    pub fn stored(&mut self, worker: u32, parent: Option<u64>, blocks: &[BlockHashes]) -> RouterEvent {
        let blocks = blocks
            .iter()
            .map(|&BlockHashes { ext, local }| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(ext),
                tokens_hash: LocalBlockHash(local),
                mm_extra_info: None,
            })
            .collect();
        let data = KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: parent.map(ExternalSequenceBlockHash),
            start_position: None,
            blocks,
        });
        self.wrap(worker, data)
    }

    pub fn removed(&mut self, worker: u32, exts: &[u64]) -> RouterEvent {
        let block_hashes = exts.iter().map(|&e| ExternalSequenceBlockHash(e)).collect();
        self.wrap(worker, KvCacheEventData::Removed(KvCacheRemoveData { block_hashes }))
    }
}

pub fn to_locals(locals: &[u64]) -> Vec<LocalBlockHash> {
    locals.iter().map(|&h| LocalBlockHash(h)).collect()
}

pub fn to_answer(scores: &OverlapScores) -> Vec<(u32, u32)> {
    scores.scores.iter().map(|(w, &d)| (w.worker_id as u32, d)).collect()
}

pub struct DynamoRadix {
    tree: RadixTree,
    events: EventMaker,
    store_errors: u64,
    remove_errors: u64,
}

impl DynamoRadix {
    pub fn new() -> Self {
        Self { tree: RadixTree::new(), events: EventMaker::default(), store_errors: 0, remove_errors: 0 }
    }
}

impl Index for DynamoRadix {
    fn name(&self) -> &str {
        "dynamo-radix-tree"
    }

    fn stored(&mut self, worker: u32, parent: Option<u64>, blocks: &[BlockHashes]) {
        let ev = self.events.stored(worker, parent, blocks);
        if self.tree.apply_event(ev).is_err() {
            self.store_errors += 1;
        }
    }

    fn removed(&mut self, worker: u32, exts: &[u64]) {
        let ev = self.events.removed(worker, exts);
        if self.tree.apply_event(ev).is_err() {
            self.remove_errors += 1;
        }
    }

    fn query(&mut self, locals: &[u64]) -> Vec<(u32, u32)> {
        to_answer(&self.tree.find_matches(to_locals(locals), false))
    }

    fn notes(&self) -> String {
        format!("apply_event errors: {} stored, {} removed", self.store_errors, self.remove_errors)
    }
}

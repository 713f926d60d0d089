//! Which holders of a partition differ from a peer's: a lead for the mismatch log line.

use prefixlog_engine::partition_of;
use prefixlog_proto::v1 as pb;
use prefixlog_proto::v1::replica_peer_client::ReplicaPeerClient;
use prefixlog_state::LiveState;
use prefixlog_state::LogIdentity;
use std::collections::BTreeMap;

/// Holders whose (blocks, digest) differ from the peer's now (offsets may differ slightly,
/// so this is a lead for the log, not a verdict). At most 20.
pub async fn differing_holders(
    client: &mut ReplicaPeerClient<tonic::transport::Channel>,
    replica: &dyn LiveState,
    ours: &LogIdentity,
    p: u32,
) -> Vec<String> {
    let Ok(theirs) = client.holder_digests(pb::HolderDigestsRequest { partition: p }).await else {
        return vec![];
    };
    let key = |model: &str, bs: u32, scheme: u32, w: u64, d: u32, l: u32| {
        format!("{model}/bs{bs}/s{scheme} worker {w} dp {d} lane {l}")
    };
    let mut map: BTreeMap<String, (u32, u64)> = theirs
        .into_inner()
        .holders
        .iter()
        .map(|h| {
            let k = h.keyspace.clone().unwrap_or_default();
            (key(&k.model, k.block_size, k.hash_scheme, h.worker, h.dp_rank, h.lane), (h.blocks, h.digest))
        })
        .collect();
    let mut out = Vec::new();
    // The keyspaces under their own read locks: ingest does not wait for the scan.
    let engine = replica.applier().lock().engine().clone();
    for ks in engine.keyspaces() {
        let g = ks.read();
        let id = g.id().clone();
        for h in g.holder_summaries().into_iter().filter(|h| partition_of(h.key.worker, ours.partitions) == p)
        {
            let k = key(&id.model, id.block_size, id.scheme, h.key.worker, h.key.dp_rank, h.key.lane);
            if map.remove(&k) != Some((h.blocks, h.digest)) {
                out.push(k);
            }
        }
    }
    out.extend(map.into_keys());
    out.truncate(20);
    out
}

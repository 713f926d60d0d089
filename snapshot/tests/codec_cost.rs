//! What the serde codec costs a restore: a 64-partition value of 1,024 feeds, 1,024 announced
//! workers and 6,400 digest points, decoded in format 6 (postcard) and in format 5 (the
//! hand-laid reader the upgrade module keeps). Run by hand, it prints both:
//! `cargo test -p prefixlog-snapshot --test codec_cost -- --ignored --nocapture`.

use prefixlog_engine::KeyspaceId;
use prefixlog_snapshot::codec::{decode_partition_value, encode_partition_value};
use prefixlog_snapshot::upgrade::partitions::encode_partitions_and_points;
use prefixlog_state::partition_state::{Feed, FeedKey};
use prefixlog_state::{DigestPoint, LaneMeta, PartitionState};
use std::time::Instant;

fn partitions() -> (Vec<PartitionState>, Vec<Vec<DigestPoint>>) {
    let ks = KeyspaceId::new("meta-llama/Llama-3.1-8B", 16, 1);
    let parts = (0..64u64)
        .map(|p| {
            let mut s = PartitionState { next_offset: 1 << 20, log_time: 86_400_000, ..Default::default() };
            s.counters.applied = 1 << 20;
            for w in (p..1024).step_by(64) {
                let key = FeedKey { keyspace: ks.clone(), worker: w, dp_rank: 0 };
                let mut feed = Feed::new(3);
                feed.last_seq = Some(w * 1000);
                feed.lanes.insert(0);
                feed.lane_meta
                    .insert(0, LaneMeta { lane: 0, kind: "full".into(), sliding_window: 0, block_size: 16 });
                s.feeds.insert(key, feed);
                s.workers.insert(w, [("url".to_string(), format!("http://10.0.0.{}:8000", w % 250))].into());
            }
            s
        })
        .collect();
    let points = (0..64)
        .map(|_| {
            (0..100)
                .map(|i| DigestPoint { next_offset: i * 7, log_time: i as u64, digest: 0xfeed ^ i as u64 })
                .collect()
        })
        .collect();
    (parts, points)
}

fn per_decode(format: u32, bytes: &[u8], runs: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..runs {
        std::hint::black_box(decode_partition_value(std::hint::black_box(bytes), format).unwrap());
    }
    t.elapsed().as_secs_f64() / f64::from(runs) * 1e6
}

#[test]
#[ignore = "a measurement, run by hand"]
fn measure_partition_value_decode() {
    let (parts, points) = partitions();
    let new = encode_partition_value(&parts, &points);
    let old = encode_partitions_and_points(&parts, &points);
    assert_eq!(decode_partition_value(&new, 6).unwrap(), decode_partition_value(&old, 5).unwrap());
    for _ in 0..3 {
        println!(
            "format 6 (postcard): {} bytes, {:.0} µs per decode; format 5 (hand-laid): {} bytes, {:.0} µs",
            new.len(),
            per_decode(6, &new, 50),
            old.len(),
            per_decode(5, &old, 50)
        );
    }
}

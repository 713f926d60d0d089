//! prost against `match_wire` on a `bench-query`-sized answer (256 scores), in one process:
//! `cargo run --release -p prefixlog-proto --example match-codec-bench`. Prints µs per call for
//! encode (from an owned message, as the server encodes) and decode (as the client decodes).

use prefixlog_proto::match_wire;
use prefixlog_proto::v1::{MatchResponse, PartitionOffset, WorkerScore};
use prost::Message;
use std::hint::black_box;
use std::time::Instant;

fn answer() -> MatchResponse {
    MatchResponse {
        scores: (0..256u64)
            .map(|w| WorkerScore {
                worker: w,
                depth: (256 - w) as u32 / 3,
                total_blocks: 5_000 + w as u32 * 7,
                ..Default::default()
            })
            .collect(),
        applied: (0..16).map(|partition| PartitionOffset { partition, offset: 700 }).collect(),
        replica_id: "bench-replica".into(),
        query_blocks: 192,
        partitions: (0..16).collect(),
        partition_count: 16,
        ..Default::default()
    }
}

/// Mean µs per call of `f` over `n` calls.
fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

fn main() {
    let r = answer();
    let bytes = r.encode_to_vec();
    assert_eq!(match_wire::encode(r.clone()), bytes);
    assert_eq!(match_wire::decode(&bytes).expect("decodes"), r);
    let n = 100_000;
    println!("answer: {} scores, {} bytes", r.scores.len(), bytes.len());
    println!("| round | prost encode | match_wire encode | prost decode | match_wire decode |");
    println!("|---|---:|---:|---:|---:|");
    for round in 1..=3 {
        let pe = per_call(n, || drop(black_box(black_box(r.clone()).encode_to_vec())));
        let fe = per_call(n, || drop(black_box(match_wire::encode(black_box(r.clone())))));
        let pd = per_call(n, || drop(black_box(MatchResponse::decode(black_box(&bytes[..])))));
        let fd = per_call(n, || drop(black_box(match_wire::decode(black_box(&bytes[..])))));
        println!("| {round} | {pe:.2} µs | {fe:.2} µs | {pd:.2} µs | {fd:.2} µs |");
    }
    println!("(encode includes cloning the message, ~1 µs, on both sides)");
}

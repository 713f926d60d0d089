//! `match_wire` against prost, the reference: every message it encodes must be prost's bytes,
//! and every byte string it decodes must give prost's answer (the same message, or an error
//! where prost errs). Seeded, so a failure names the seed that reproduces it.

use prefixlog_proto::match_wire;
use prefixlog_proto::v1::{
    Interval, MatchError, MatchResponse, PartitionOffset, TierDepth, TierRun, WorkerScore,
};
use prost::encoding::encode_varint;
use prost::Message;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A value with the magnitudes that matter for varints: 0 (not written), one byte, several,
/// and the type's maximum.
fn magnitude(rng: &mut ChaCha8Rng, max: u64) -> u64 {
    match rng.random_range(0..6) {
        0 => 0,
        1 => rng.random_range(1..128),
        2 => rng.random_range(128..1 << 14).min(max),
        3 => max,
        _ => rng.random_range(0..=max),
    }
}

fn score(rng: &mut ChaCha8Rng) -> WorkerScore {
    let u32_max = u64::from(u32::MAX);
    let intervals = if rng.random_ratio(1, 8) {
        (0..rng.random_range(1..4))
            .map(|_| Interval { start: magnitude(rng, u32_max) as u32, end: magnitude(rng, u32_max) as u32 })
            .collect()
    } else {
        Vec::new()
    };
    WorkerScore {
        worker: magnitude(rng, u64::MAX),
        dp_rank: magnitude(rng, u32_max) as u32,
        lane: magnitude(rng, u32_max) as u32,
        depth: magnitude(rng, u32_max) as u32,
        total_blocks: magnitude(rng, u32_max) as u32,
        inferred: rng.random(),
        intervals,
        gapped: rng.random(),
        ..tiered(rng)
    }
}

/// One score in eight has tier parts (fields 9-11, written by prost).
fn tiered(rng: &mut ChaCha8Rng) -> WorkerScore {
    if !rng.random_ratio(1, 8) {
        return WorkerScore::default();
    }
    let u32_max = u64::from(u32::MAX);
    WorkerScore {
        tiers: (0..rng.random_range(0..4))
            .map(|t| TierDepth {
                tier: t,
                depth: magnitude(rng, u32_max) as u32,
                total_blocks: magnitude(rng, u32_max) as u32,
            })
            .collect(),
        runs: (0..rng.random_range(0..4))
            .map(|_| TierRun { tier: rng.random_range(0..4), blocks: magnitude(rng, u32_max) as u32 })
            .collect(),
        weighted_score: magnitude(rng, u64::MAX),
        ..Default::default()
    }
}

fn response(rng: &mut ChaCha8Rng) -> MatchResponse {
    let n = if rng.random_ratio(1, 10) { rng.random_range(200..400) } else { rng.random_range(0..40) };
    MatchResponse {
        scores: (0..n).map(|_| score(rng)).collect(),
        applied: (0..rng.random_range(0..5))
            .map(|p| PartitionOffset { partition: p, offset: rng.random_range(-2..1 << 40) })
            .collect(),
        replica_id: (0..rng.random_range(0..12)).map(|_| rng.random_range('a'..='é')).collect(),
        stale: rng.random(),
        query_blocks: magnitude(rng, u64::from(u32::MAX)) as u32,
        request_id: magnitude(rng, u64::MAX),
        partitions: (0..rng.random_range(0..5)).collect(),
        partition_count: rng.random_range(0..64),
        // In-band errors (MatchStream): a nested message after the scores.
        error: rng.random_ratio(1, 10).then(|| MatchError {
            code: rng.random_range(1..17),
            message: (0..rng.random_range(0..20)).map(|_| rng.random_range('a'..='é')).collect(),
        }),
    }
}

/// Decoding `bytes` gives what prost gives.
fn assert_decodes_as_prost(bytes: &[u8], what: &str) {
    let ours = match_wire::decode(bytes);
    let prost = MatchResponse::decode(bytes);
    match (&ours, &prost) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}: decoded differently"),
        (Err(_), Err(_)) => {}
        _ => panic!("{what}: ours {:?}, prost {:?}", ours.map(|_| ()), prost.map(|_| ())),
    }
}

fn varint(v: u64) -> Vec<u8> {
    let mut b = Vec::new();
    encode_varint(v, &mut b);
    b
}

/// A score framed as field 1 from a hand-made body.
fn framed(body: &[u8]) -> Vec<u8> {
    let mut b = vec![0x0a];
    b.extend(varint(body.len() as u64));
    b.extend_from_slice(body);
    b
}

/// Extra bytes for a score body: fields prost must treat as prost does.
fn score_extra(rng: &mut ChaCha8Rng) -> Vec<u8> {
    match rng.random_range(0..16) {
        // An unknown varint field (a newer server's), and an unknown length-delimited one.
        0 => [vec![0x48], varint(rng.random())].concat(),
        1 => [vec![0x52, 3], b"abc".to_vec()].concat(),
        // A field repeated (the last one wins) and a non-minimal varint.
        2 => [vec![0x20], varint(rng.random_range(0..1000))].concat(),
        3 => vec![0x28, 0x85, 0x80, 0x00],
        // A uint32 field holding more than 32 bits (prost truncates).
        4 => [vec![0x18], varint(u64::MAX - 5)].concat(),
        // A varint whose tenth byte overflows 64 bits (prost's error).
        5 => vec![0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
        // A known field number with the wrong wire type.
        6 => vec![0x21, 1, 2, 3, 4, 5, 6, 7, 8],
        _ => Vec::new(),
    }
}

/// A message of hand-made fields: scores (some with extra bytes) interleaved with the other
/// fields' prost bytes, plus unknown top-level fields.
fn spliced(rng: &mut ChaCha8Rng, r: &MatchResponse) -> Vec<u8> {
    let rest = MatchResponse { scores: Vec::new(), ..r.clone() }.encode_to_vec();
    let mut fields: Vec<Vec<u8>> = r
        .scores
        .iter()
        .map(|s| {
            let mut body = s.encode_to_vec();
            if rng.random_ratio(1, 4) {
                body.extend(score_extra(rng));
            }
            framed(&body)
        })
        .collect();
    let cut = rng.random_range(0..=fields.len());
    fields.insert(cut, rest);
    if rng.random_ratio(1, 3) {
        let unknown = match rng.random_range(0..4) {
            0 => [vec![0xc8, 0x01], varint(rng.random())].concat(), // field 25, varint
            1 => vec![0xd1, 0x01, 1, 2, 3, 4, 5, 6, 7, 8],          // field 26, fixed64
            2 => vec![0xdd, 0x01, 1, 2, 3, 4],                      // field 27, fixed32
            _ => vec![0x08, 0x01],                                  // field 1 as a varint
        };
        fields.insert(rng.random_range(0..=fields.len()), unknown);
    }
    fields.concat()
}

/// Random damage: truncation, flipped bytes, inserted bytes.
fn damaged(rng: &mut ChaCha8Rng, mut b: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.random_range(1..3) {
        if b.is_empty() {
            break;
        }
        let at = rng.random_range(0..b.len());
        match rng.random_range(0..3) {
            0 => b.truncate(at),
            1 => b[at] ^= 1 << rng.random_range(0..8),
            _ => b.insert(at, rng.random()),
        }
    }
    b
}

#[test]
fn encodes_the_bytes_prost_encodes() {
    for seed in 0..3_000 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let r = response(&mut rng);
        let bytes = r.encode_to_vec();
        assert_eq!(match_wire::encode(r.clone()), bytes, "seed {seed}");
        assert_eq!(match_wire::decode(&bytes).expect("decodes"), r, "seed {seed}");
    }
}

#[test]
fn decodes_what_prost_decodes_and_fails_where_prost_fails() {
    let (mut ok, mut err) = (0, 0);
    for seed in 0..3_000 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let r = response(&mut rng);
        let spliced = spliced(&mut rng, &r);
        assert_decodes_as_prost(&spliced, &format!("seed {seed}, spliced"));
        let damaged = damaged(&mut rng, spliced.clone());
        assert_decodes_as_prost(&damaged, &format!("seed {seed}, damaged"));
        for b in [&spliced, &damaged] {
            if MatchResponse::decode(&b[..]).is_ok() {
                ok += 1;
            } else {
                err += 1;
            }
        }
    }
    // The damage must exercise both outcomes, or the test compares too little.
    assert!(ok > 1_000 && err > 1_000, "{ok} damaged messages decoded, {err} failed");
}

#[test]
fn a_score_with_fields_it_does_not_know_keeps_them_as_prost_does() {
    // A newer server's score with field 12 (a varint): prost skips it, so must the fast path.
    let known = WorkerScore { worker: 7, depth: 3, total_blocks: 9, ..Default::default() };
    let body = [known.encode_to_vec(), vec![0x60, 0x2a]].concat();
    let r = match_wire::decode(&framed(&body)).expect("decodes");
    assert_eq!(r.scores, vec![known]);
}

#[test]
fn hand_made_score_bodies_decode_as_prost_decodes_them() {
    // Bodies the in-order reader must either read exactly or hand to the any-order reader
    // (or prost): each is checked alone, and after a plain score (a fallback must not keep
    // anything the in-order attempt filled in).
    let interval = |s: u8, e: u8| vec![0x3a, 4, 0x08, s, 0x10, e];
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("in order", vec![0x08, 0x05, 0x20, 0x03, 0x28, 0x09, 0x40, 0x01]),
        ("two-byte varints", vec![0x08, 0x80, 0x01, 0x20, 0xff, 0x7f]),
        ("non-minimal two-byte varint", vec![0x08, 0x80, 0x00, 0x20, 0x85, 0x00]),
        ("out of order", vec![0x20, 0x03, 0x08, 0x05]),
        ("a field twice", vec![0x08, 0x05, 0x08, 0x06]),
        (
            "intervals, then gapped",
            [vec![0x08, 0x05], interval(1, 2), interval(3, 4), vec![0x40, 0x01]].concat(),
        ),
        ("an interval after gapped", [vec![0x08, 0x05, 0x40, 0x01], interval(1, 2)].concat()),
        ("intervals split by a field", [interval(1, 2), vec![0x20, 0x03], interval(3, 4)].concat()),
        ("a continuation byte at the end", vec![0x08, 0x05, 0x20, 0x80]),
        ("a non-minimal key", vec![0x88, 0x00, 0x05]),
        ("a bad interval length", [vec![0x08, 0x05], vec![0x3a, 9, 0x08, 1]].concat()),
        ("bool from a large varint", vec![0x30, 0x80, 0x02, 0x40, 0x02]),
        ("empty", vec![]),
    ];
    let plain = framed(&WorkerScore { worker: 1, depth: 2, ..Default::default() }.encode_to_vec());
    for (what, body) in &bodies {
        assert_decodes_as_prost(&framed(body), what);
        assert_decodes_as_prost(&[plain.clone(), framed(body), plain.clone()].concat(), what);
    }
    // A non-minimal top-level key for the score list (0x8a 0x00 = field 1, length-delimited).
    let mut b = vec![0x8a, 0x00, 2, 0x08, 0x05];
    b.extend(&plain);
    assert_decodes_as_prost(&b, "a non-minimal top-level key");
}

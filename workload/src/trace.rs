//! The Mooncake trace format and its expansion into block hashes.

use anyhow::Context;
use prefixlog_ids::BlockHashes;
use serde::Deserialize;
use std::io::BufRead;
use std::path::Path;

/// One request of the trace: arrival time and its chain of 512-token block ids.
#[derive(Clone, Debug, Deserialize)]
pub struct TraceRequest {
    #[serde(rename = "timestamp")]
    pub timestamp_ms: u64,
    pub hash_ids: Vec<u64>,
}

/// Reads a Mooncake-format JSONL trace.
pub fn load_trace(path: &Path) -> anyhow::Result<Vec<TraceRequest>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening trace {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let r: TraceRequest = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: not a trace request", path.display(), i + 1))?;
        out.push(r);
    }
    Ok(out)
}

/// How far apart [`repeat_hours`] starts the repetitions (ms): a whole number of hours (one
/// for the bundled trace), so that time never goes backwards across a boundary.
pub fn repeat_period_ms(trace: &[TraceRequest]) -> u64 {
    let end = trace.iter().map(|r| r.timestamp_ms).max().map_or(0, |t| t + 1);
    end.div_ceil(3_600_000).max(1) * 3_600_000
}

/// The trace `hours` times back to back (a repetition per hour for a trace of at most an hour;
/// longer traces are spaced by whole hours), each with fresh
/// content (block ids moved past every earlier repetition's), as a fleet that serves new
/// conversations every hour: the log grows with the hours, the resident state stays bounded
/// by the workers' capacity.
pub fn repeat_hours(trace: &[TraceRequest], hours: usize) -> Vec<TraceRequest> {
    let period = repeat_period_ms(trace);
    let span = trace.iter().flat_map(|r| r.hash_ids.iter()).max().map_or(0, |m| m + 1);
    (0..hours.max(1) as u64)
        .flat_map(|h| {
            trace.iter().map(move |r| TraceRequest {
                timestamp_ms: r.timestamp_ms + h * period,
                hash_ids: r.hash_ids.iter().map(|id| id + h * span).collect(),
            })
        })
        .collect()
}

/// Expands a request into its chain of block hashes.
///
/// `local` stands for the canonical content hash of a block's tokens (it depends only on the
/// block, not on its parent), `ext` for the engine's chained sequence hash (it depends on the
/// whole prefix). Copies are disjoint: copy `c` hashes different content from copy `c'`.
pub fn expand_request(req: &TraceRequest, copy: usize, stretch: usize) -> Vec<BlockHashes> {
    let mut out = Vec::with_capacity(req.hash_ids.len() * stretch);
    let mut ext = 0x9e37_79b9_7f4a_7c15u64 ^ copy as u64;
    for &id in &req.hash_ids {
        for j in 0..stretch.max(1) {
            let local = mix64(mix64(id.wrapping_mul(0x100) ^ j as u64) ^ (copy as u64) << 56);
            ext = mix64(ext.rotate_left(17) ^ local);
            out.push(BlockHashes { ext, local });
        }
    }
    out
}

/// A 64-bit finaliser (murmur3 fmix64), used to spread ids into hashes.
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

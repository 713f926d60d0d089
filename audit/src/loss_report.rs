//! A [`LossReport`] for people (a table ending with the one summary line) and for tools (JSON
//! lines: one per decision, one per aggregate row, one summary).

use crate::loss::{LossReport, LossTotals};
use std::fmt::Write;

fn row(out: &mut String, group: &str, key: &str, t: &LossTotals) {
    let _ = writeln!(
        out,
        "{group:<9} {key:<28} {:>9} {:>9} {:>11} {:>11} {:>12} {:>7.1}%",
        t.decisions,
        t.lossy_decisions,
        t.achievable_blocks,
        t.lost_blocks,
        t.lost_tokens,
        t.lost_percent()
    );
}

/// The summary line: `loss: N decisions, N lost blocks (X.X% of achievable), by policy ...`.
pub fn summary_line(r: &LossReport) -> String {
    let policies: Vec<String> =
        r.by_policy.iter().map(|(p, t)| format!("{p} {:.1}%", t.lost_percent())).collect();
    format!(
        "loss: {} decisions, {} lost blocks ({:.1}% of achievable), by policy {}",
        r.total.decisions,
        r.total.lost_blocks,
        r.total.lost_percent(),
        if policies.is_empty() { "-".to_string() } else { policies.join(", ") }
    )
}

/// The table: one row per gateway, keyspace, policy, worker and time bucket, then the summary.
pub fn table(r: &LossReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<9} {:<28} {:>9} {:>9} {:>11} {:>11} {:>12} {:>8}",
        "group", "key", "decisions", "lossy", "achievable", "lost", "lost_tokens", "lost%"
    );
    for (k, t) in &r.by_gateway {
        row(&mut out, "gateway", k, t);
    }
    for (k, t) in &r.by_keyspace {
        row(&mut out, "keyspace", k, t);
    }
    for (k, t) in &r.by_policy {
        row(&mut out, "policy", k, t);
    }
    for (k, t) in &r.by_worker {
        row(&mut out, "worker", &k.to_string(), t);
    }
    for (k, t) in &r.by_bucket {
        row(&mut out, "bucket", &format!("{k}+{}ms", r.bucket_ms), t);
    }
    row(&mut out, "total", "", &r.total);
    out.push_str(&summary_line(r));
    out.push('\n');
    out
}

/// JSON lines: `{"decision":..}` per kept decision, `{"group":..,"key":..,"totals":..}` per
/// aggregate row, and a last `{"summary":..}`.
pub fn json_lines(r: &LossReport) -> Vec<String> {
    let mut out: Vec<String> =
        r.decisions.iter().map(|d| serde_json::json!({ "decision": d }).to_string()).collect();
    let mut group = |g: &str, k: String, t: &LossTotals| {
        out.push(serde_json::json!({ "group": g, "key": k, "totals": t }).to_string());
    };
    r.by_gateway.iter().for_each(|(k, t)| group("gateway", k.clone(), t));
    r.by_keyspace.iter().for_each(|(k, t)| group("keyspace", k.clone(), t));
    r.by_policy.iter().for_each(|(k, t)| group("policy", k.clone(), t));
    r.by_worker.iter().for_each(|(k, t)| group("worker", k.to_string(), t));
    r.by_bucket.iter().for_each(|(k, t)| group("bucket", k.to_string(), t));
    out.push(
        serde_json::json!({
            "summary": r.total,
            "lost_percent": r.total.lost_percent(),
            "replayed": r.replayed,
            "secs": r.secs,
        })
        .to_string(),
    );
    out
}

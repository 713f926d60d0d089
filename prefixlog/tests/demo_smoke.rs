//! `prefixlog demo` end to end with a tiny configuration: exits 0, prints the table, writes the
//! SVG, and the shared index's hit ratio lies between the gateway-local one and the oracle.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The bundled Mooncake trace when present, else a small synthetic conversation trace.
fn trace(dir: &std::path::Path) -> PathBuf {
    let bundled = std::env::var_os("PREFIXLOG_TRACE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/mooncake/conversation_trace.jsonl")
    });
    if bundled.is_file() {
        return bundled;
    }
    let mut s = String::new();
    for i in 0..150u64 {
        // 25 conversations; turn k of conversation c extends turn k-1.
        let (c, k) = (i % 25, i / 25);
        let ids: Vec<String> =
            std::iter::once(0).chain((0..=k).map(|t| 1000 * (c + 1) + t)).map(|x| x.to_string()).collect();
        s.push_str(&format!("{{\"timestamp\": {}, \"hash_ids\": [{}]}}\n", i * 100, ids.join(", ")));
    }
    let p = dir.join("trace.jsonl");
    std::fs::write(&p, s).expect("write trace");
    p
}

fn ratio(out: &str, label: &str) -> f64 {
    let line = out.lines().find(|l| l.starts_with(&format!("| {label} |"))).unwrap_or_else(|| {
        panic!("no `{label}` row in the demo's output:\n{out}");
    });
    line.trim_end_matches('|').rsplit('|').next().unwrap().trim().parse().expect("a ratio")
}

#[test]
fn demo_runs_and_reports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plot = dir.path().join("plot.svg");
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_prefixlog"))
        // A generous deadline: `make test` runs test binaries side by side on 2 cores.
        .args([
            "demo",
            "--requests",
            "150",
            "--workers",
            "4",
            "--gateways",
            "2",
            "--speedup",
            "50",
            "--deadline",
            "200ms",
        ])
        .arg("--trace")
        .arg(trace(dir.path()))
        .arg("--plot")
        .arg(&plot)
        .output()
        .expect("run prefixlog demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed: {}\n{stdout}\n{stderr}", out.status);
    assert!(t.elapsed() < Duration::from_secs(60), "demo took {:?}", t.elapsed());
    assert!(stdout.contains("| requests routed | 150 "), "{stdout}");
    assert!(stdout.contains("| anti-entropy mismatches | 0 |"), "{stdout}");
    assert!(stdout.contains("| replicas caught up, engine digests equal | yes / yes |"), "{stdout}");
    let shared = ratio(&stdout, "prefix-hit ratio, shared index (achieved)");
    let oracle = ratio(&stdout, "prefix-hit ratio, oracle (perfect knowledge)");
    let local = ratio(&stdout, "prefix-hit ratio, gateway-local trees");
    assert!(shared <= oracle + 1e-9, "shared {shared} > oracle {oracle}");
    assert!(shared >= local - 0.02, "shared {shared} < gateway-local {local}");
    let svg = std::fs::read_to_string(&plot).expect("plot written");
    assert!(svg.starts_with("<svg") && svg.contains("<polyline") && svg.trim_end().ends_with("</svg>"));
}

//! The bridge's `/metrics` (issue 35), scraped from the real binary: `prefixlog bridge` with two
//! engine streams (one engine of two data-parallel ranks) on the embedded broker. Every series
//! it can emit exists as soon as a stream starts (each reason and outcome of a family with a
//! zero), so the scrape covers them all: Prometheus conventions
//! (`prefixlog_query::exposition`), `promtool check metrics` where promtool is installed
//! (`PREFIXLOG_PROMTOOL=required`: a failure without it), one family per measurement (reasons
//! and outcomes as labels, no suffix families), `prefixlog_build_info`, the process metrics.
//! No engine publishes here: the counters are zero, which is what an idle engine shows.

use prefixlog_ingest::EmbeddedKafka;
use prefixlog_query::exposition::{convention_problems, parse, promtool_check};
use prefixlog_tests::http::http_get;
use prefixlog_tests::listen_port;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_exposition_follows_conventions() {
    let kafka = EmbeddedKafka::start("prefixlog.records", 4).unwrap();
    let admin: SocketAddr = ([127, 0, 0, 1], listen_port()).into();
    let (e0, e1) = (listen_port(), listen_port());
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("bridge.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_prefixlog"))
        .args(["bridge", "--brokers", &kafka.bootstrap_servers(), "--partitions", "4"])
        .args(["--model", "m", "--block-size", "16", "--admin-addr", &admin.to_string()])
        .args(["--pod-name", "vllm-0", "--serving-url", "http://127.0.0.1:8000"])
        .args(["--engine", &format!("endpoint=tcp://127.0.0.1:{e0},dp=0")])
        .args(["--engine", &format!("endpoint=tcp://127.0.0.1:{e1},dp=1")])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn prefixlog bridge");
    let t = Instant::now();
    let text = loop {
        let (code, text) = http_get(admin, "/metrics").await;
        // Both streams are exported once running (the histogram's count per stream).
        if code == 200 && text.matches("prefixlog_bridge_publish_latency_seconds_count{").count() == 2 {
            break text;
        }
        assert!(child.try_wait().unwrap().is_none(), "the bridge exited: {}", bridge_log(dir.path()));
        assert!(t.elapsed() < Duration::from_secs(60), "no /metrics with 2 streams: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(http_get(admin, "/readyz").await.0, 200);
    let _ = child.kill();
    let _ = child.wait();

    let problems = convention_problems(&text);
    assert!(problems.is_empty(), "{problems:#?}\n{text}");
    let fams = parse(&text);
    let bridge: Vec<&String> = fams.keys().filter(|n| n.starts_with("prefixlog_bridge_")).collect();
    assert_eq!(bridge.len(), 18, "{bridge:#?}");
    for (family, label, values) in [
        ("prefixlog_bridge_events_refused_total", "reason", 13),
        ("prefixlog_bridge_resets_total", "reason", 2),
        ("prefixlog_bridge_messages_skipped_total", "reason", 3),
        ("prefixlog_bridge_replays_total", "outcome", 3),
        ("prefixlog_bridge_batches_total", "outcome", 3),
        ("prefixlog_bridge_disconnects_total", "reason", 4),
        ("prefixlog_bridge_resets_total", "reason", 2),
    ] {
        let f = &fams[family];
        let seen: std::collections::BTreeSet<&str> =
            f.samples.iter().filter_map(|(_, l)| l.get(label).map(String::as_str)).collect();
        assert_eq!(seen.len(), values, "{family}: {seen:?}");
        assert_eq!(f.samples.len(), values * 2, "{family}: one series per value and stream");
    }
    assert!(text.contains("prefixlog_build_info{revision="), "{text}");
    assert!(fams.contains_key("process_resident_memory_bytes"), "{text}");
    match promtool_check(&text) {
        Ok(Some(report)) => eprintln!("[bridge metrics] promtool check metrics: ok {}", report.trim()),
        Ok(None) => {
            assert_ne!(
                std::env::var("PREFIXLOG_PROMTOOL").as_deref(),
                Ok("required"),
                "promtool is not installed"
            );
            eprintln!("[bridge metrics] promtool check: NOT RUN (promtool not installed)");
        }
        Err(report) => panic!("promtool check metrics:\n{report}\n{text}"),
    }
}

fn bridge_log(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("bridge.log")).unwrap_or_default()
}

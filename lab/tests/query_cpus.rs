//! `--query-cpus` pins the process before anything else starts: a set the machine cannot run
//! on fails the start with the flag named, instead of serving unpinned.

use std::process::Command;

#[test]
fn a_cpu_the_machine_does_not_have_fails_the_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_prefixlog-lab"))
        .args(["bench-query", "--query-cpus", "1000"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "bench-query started on CPU 1000: {stderr}");
    assert!(stderr.contains("--query-cpus 1000"), "bench-query: {stderr}");
}

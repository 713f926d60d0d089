//! The binary's Kafka flags against a broker as production runs it: SASL/SCRAM-SHA-512 over TLS
//! (`prefixlog_tests::secured`: tansu behind a TLS terminator, certificates made at start).
//!
//! - `publish-trace` publishes and `serve` reads it to the end (ready at lag 0), the connection given
//!   as `-X` properties and the password in a `--kafka-config` file, as docs/operations.md
//!   ("Production Kafka") shows;
//! - `serve` and `publish-trace` with a wrong password in `PREFIXLOG_KAFKA_PROPERTIES` (the environment
//!   form) exit non-zero on their own, their error naming the cause.
//!
//! Runs when `PREFIXLOG_TANSU_BIN` is set (scripts/with-tansu.sh; scripts/test.sh runs it in the
//! tansu leg); elsewhere it prints NOT RUN and passes.

use prefixlog_tests::http::http_get;
use prefixlog_tests::secured::{tansu_bin, SecuredKafka, PASSWORD, USER};
use prefixlog_tests::unique_topic;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Generous: a loaded 2-core CI machine. Nothing is asserted about how long anything took.
const DEADLINE: Duration = Duration::from_secs(90);

fn prefixlog(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_prefixlog"));
    for var in [
        "PREFIXLOG_KAFKA_PROPERTIES",
        "PREFIXLOG_KAFKA_CONFIG",
        "RUST_LOG",
        "RUST_BACKTRACE",
        "RUST_LIB_BACKTRACE",
    ] {
        c.env_remove(var);
    }
    c.args(args);
    c
}

/// The first `n` requests of the bundled trace (a small `publish-trace`).
fn small_trace(dir: &Path, n: usize) -> String {
    let bundled = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mooncake/conversation_trace.jsonl");
    let text = std::fs::read_to_string(bundled).unwrap();
    let head: Vec<&str> = text.lines().take(n).collect();
    let path = dir.join("trace.jsonl");
    std::fs::write(&path, head.join("\n") + "\n").unwrap();
    path.display().to_string()
}

/// Runs `cmd` to its end (it must end by itself within [`DEADLINE`]).
fn run_to_end(mut cmd: Command, what: &str) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("{what} did not end within {DEADLINE:?}: {:?}", child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_and_serve_over_sasl_ssl_and_a_wrong_password_named() {
    let bin = match tansu_bin() {
        Ok(b) => b,
        Err(why) => return eprintln!("[secured_cli] NOT RUN: {why}"),
    };
    let kafka = SecuredKafka::start(&bin).await.expect("secured tansu starts");
    let topic = unique_topic("prefixlog.secured-cli");
    prefixlog_ingest::create_topic(&kafka.connection(), &topic, 4, &[]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), 60);
    let config = dir.path().join("client.properties");
    std::fs::write(&config, format!("# from a Kubernetes Secret\nsasl.password={PASSWORD}\n")).unwrap();
    let ca = kafka.ca.display().to_string();
    let x = [
        "-X",
        "security.protocol=SASL_SSL",
        "-X",
        &format!("ssl.ca.location={ca}"),
        "-X",
        "sasl.mechanism=SCRAM-SHA-512",
        "-X",
        &format!("sasl.username={USER}"),
    ];
    let log = ["--brokers", &kafka.brokers, "--topic", &topic, "--partitions", "4"];

    let mut replay = prefixlog(&["publish-trace"]);
    replay.args(log).args(x).arg("--kafka-config").arg(&config).args(["--trace", &trace, "--workers", "4"]);
    let out = run_to_end(replay, "publish-trace");
    assert!(out.status.success(), "replay over SASL_SSL: {}", String::from_utf8_lossy(&out.stderr));

    let admin = SocketAddr::from(([127, 0, 0, 1], prefixlog_node::loopback_port()));
    let serve_log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
    let mut serve = prefixlog(&["serve"])
        .args(log)
        .args(x)
        .arg("--kafka-config")
        .arg(&config)
        .args(["--ready-lag", "0", "--tick-interval", "0s", "--grpc-addr", "127.0.0.1:0"])
        .args(["--peer-addr", "127.0.0.1:0", "--admin-addr", &admin.to_string()])
        .stdout(Stdio::null())
        .stderr(serve_log)
        .spawn()
        .unwrap();
    let t = Instant::now();
    // Ready at lag 0: every partition read to its high watermark over SASL_SSL.
    while http_get(admin, "/readyz").await.0 != 200 {
        let log = || std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
        assert!(serve.try_wait().unwrap().is_none(), "serve exited:\n{}", log());
        assert!(t.elapsed() < DEADLINE, "serve over SASL_SSL not ready within {DEADLINE:?}:\n{}", log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = serve.kill();
    let _ = serve.wait();

    // The environment form, with a wrong password.
    let wrong = format!(
        "security.protocol=SASL_SSL;ssl.ca.location={ca};sasl.mechanism=SCRAM-SHA-512;\
         sasl.username={USER};sasl.password=not-{PASSWORD}"
    );
    for cmd in ["serve", "publish-trace"] {
        let mut c = prefixlog(&[cmd]);
        c.args(log).env("PREFIXLOG_KAFKA_PROPERTIES", &wrong);
        if cmd == "serve" {
            c.args([
                "--grpc-addr",
                "127.0.0.1:0",
                "--peer-addr",
                "127.0.0.1:0",
                "--admin-addr",
                "127.0.0.1:0",
            ]);
        } else {
            c.args(["--trace", &trace]);
        }
        let out = run_to_end(c, cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd} with a wrong password must fail:\n{stderr}");
        // What the process ends with: `Error: ...` (main's error), the last line.
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("Error: ")
                && last.contains("SASL authentication error")
                && last.contains("refused the connection"),
            "{cmd}'s error names the cause:\n{stderr}"
        );
        eprintln!("[secured_cli] {cmd} with a wrong password: {last}");
    }
}

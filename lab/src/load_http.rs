//! `load-http`: an HTTP/1.1 load generator for side-by-side `/query` comparisons (issue 51),
//! so that the client is not what limits the server being measured.
//!
//! The Python client of `tests/upstream/bench_dynamo.py` spent most of a core per 10,000
//! queries/s: it limited both sides. This one keeps `--connections` persistent connections on
//! the lab's runtime and posts the bodies of `--bodies` (one per line) round robin:
//!
//! - **closed loop** (no `--rate`): each connection sends its next body as soon as the last
//!   answer arrived; what is measured is sustained queries/s at saturation;
//! - **open loop** (`--rate R`): query `k` is due at `k / R` seconds after the start, whatever
//!   the answers before it did, and its latency counts from when it was due if every
//!   connection was busy then (so a server that falls behind is charged for the queue it
//!   built, not hidden by the client waiting), else from when it was sent.
//!
//! Only queries due in the window after `--warm-up` are counted: answered ones (2xx) in
//! `queries`, `qps` and the latency quantiles, the others in `errors`. One JSON line goes to
//! stdout (for scripts), one line for people to stderr.

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most bodies read from `--bodies`: the file is read whole into memory.
const MAX_BODIES: usize = 1_000_000;
/// Longest a connect, or a query from send to the end of its answer, may take (then counted
/// as an error and the connection dropped).
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed connect.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to post, e.g. http://127.0.0.1:8090/query (plain HTTP/1.1).
    #[arg(long)]
    url: hyper::Uri,
    /// A file with one request body per line (JSON), posted round robin.
    #[arg(long)]
    bodies: PathBuf,
    /// Persistent connections (each has at most one query outstanding).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    connections: u64,
    /// Open loop at this many queries/s (default: closed loop at saturation).
    #[arg(long)]
    rate: Option<f64>,
    /// How long queries are counted, after the warm-up.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Queries due before this are sent but not counted.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warm_up: Duration,
}

/// What one connection saw in the counted window.
#[derive(Default)]
struct Seen {
    latencies_us: Vec<u64>,
    errors: u64,
    /// Every query sent, warm-up included (what the server's CPU time is divided by).
    sent: u64,
}

/// The shared plan: bodies, the ticket counter, and when each ticket is due.
struct Plan {
    bodies: Vec<Bytes>,
    next: AtomicU64,
    start: Instant,
    counted_from: Instant,
    end: Instant,
    /// Seconds between due times (open loop), none for closed loop.
    interval: Option<f64>,
}

impl Plan {
    /// The next ticket's index and when it is due, or none once the window is over.
    fn take(&self) -> Option<(u64, Instant)> {
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        let due = match self.interval {
            Some(dt) => self.start + Duration::from_secs_f64(k as f64 * dt),
            None => Instant::now(),
        };
        (due < self.end).then_some((k, due))
    }

    fn body(&self, k: u64) -> Bytes {
        self.bodies[(k % self.bodies.len() as u64) as usize].clone()
    }
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let bodies = read_bodies(&a.bodies)?;
    let authority = a.url.authority().context("--url needs host:port")?.to_string();
    if a.url.scheme_str() != Some("http") {
        bail!("--url must be plain http:// (got {})", a.url);
    }
    if let Some(r) = a.rate.filter(|r| !(r.is_finite() && *r > 0.0)) {
        bail!("--rate must be a positive number of queries/s (got {r})");
    }
    let start = Instant::now();
    let plan = Arc::new(Plan {
        bodies,
        next: AtomicU64::new(0),
        start,
        counted_from: start + a.warm_up,
        end: start + a.warm_up + a.duration,
        interval: a.rate.map(|r| 1.0 / r),
    });
    let cpu0 = process_cpu_secs();
    let mut tasks = Vec::new();
    for _ in 0..a.connections {
        let (plan, authority, uri) = (plan.clone(), authority.clone(), a.url.clone());
        tasks.push(tokio::spawn(async move { connection(plan, authority, uri).await }));
    }
    let mut all = Seen::default();
    for t in tasks {
        let seen = t.await?;
        all.latencies_us.extend(seen.latencies_us);
        all.errors += seen.errors;
        all.sent += seen.sent;
    }
    let client_cores = (process_cpu_secs() - cpu0) / start.elapsed().as_secs_f64();
    report(&a, all, client_cores);
    Ok(())
}

/// One connection: takes tickets until the window ends, reconnecting after an error.
async fn connection(plan: Arc<Plan>, authority: String, uri: hyper::Uri) -> Seen {
    let mut seen = Seen::default();
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    while let Some((k, due)) = plan.take() {
        // A ticket taken after it was due waited for a free connection: its latency counts from
        // when it was due. One taken early waits for its time on tokio's timer, which rounds up
        // to its next millisecond tick: that wait is the client's, so its latency counts from
        // when it was sent. (Closed loop tickets are due when taken and never sleep.)
        let from = if Instant::now() >= due {
            due
        } else {
            tokio::time::sleep_until(due.into()).await;
            Instant::now()
        };
        if sender.as_ref().is_none_or(|s| s.is_closed()) {
            sender = connect(&authority).await.ok();
            if sender.is_none() {
                // Not a busy loop of refused connects (each one counted below).
                tokio::time::sleep(RECONNECT_BACKOFF).await;
            }
        }
        let outcome = match sender.as_mut() {
            Some(s) => post(s, &uri, &authority, plan.body(k)).await,
            None => Outcome::Broken,
        };
        if outcome == Outcome::Broken {
            sender = None;
        }
        seen.sent += 1;
        if due >= plan.counted_from {
            // Only answered queries have a latency: a fast refusal must not look like speed.
            match outcome {
                Outcome::Answered => seen.latencies_us.push(from.elapsed().as_micros() as u64),
                Outcome::Refused | Outcome::Broken => seen.errors += 1,
            }
        }
    }
    seen
}

/// What became of one query.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// A 2xx answer, read whole.
    Answered,
    /// Another status, its body read: the connection is kept.
    Refused,
    /// No answer (connect, send or read failed, or [`QUERY_TIMEOUT`] passed): reconnect.
    Broken,
}

async fn connect(authority: &str) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let tcp = tokio::time::timeout(QUERY_TIMEOUT, tokio::net::TcpStream::connect(authority)).await??;
    tcp.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Posts one body and reads the answer, within [`QUERY_TIMEOUT`].
async fn post(s: &mut SendRequest<Full<Bytes>>, uri: &hyper::Uri, host: &str, body: Bytes) -> Outcome {
    let req = hyper::Request::post(uri.path())
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body));
    let Ok(req) = req else { return Outcome::Broken };
    let exchange = async {
        s.ready().await.ok()?;
        let resp = s.send_request(req).await.ok()?;
        let answered = resp.status().is_success();
        resp.into_body().collect().await.ok()?;
        Some(if answered { Outcome::Answered } else { Outcome::Refused })
    };
    tokio::time::timeout(QUERY_TIMEOUT, exchange).await.ok().flatten().unwrap_or(Outcome::Broken)
}

fn read_bodies(path: &PathBuf) -> anyhow::Result<Vec<Bytes>> {
    let text = std::fs::read(path).with_context(|| format!("reading --bodies {}", path.display()))?;
    let bodies: Vec<Bytes> = text
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .take(MAX_BODIES)
        .map(Bytes::copy_from_slice)
        .collect();
    if bodies.is_empty() {
        bail!("--bodies {} holds no request body (one per line)", path.display());
    }
    Ok(bodies)
}

/// This process's user + system CPU seconds (`/proc/self/stat`), 0 where unreadable.
fn process_cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0 // USER_HZ is 100 on Linux
}

fn report(a: &Args, mut seen: Seen, client_cores: f64) {
    seen.latencies_us.sort_unstable();
    let n = seen.latencies_us.len();
    let q = |p: f64| prefixlog_workload::quantile::nearest_rank(&seen.latencies_us, p).unwrap_or(0);
    let secs = a.duration.as_secs_f64();
    let (mode, offered) = match a.rate {
        Some(r) => ("open", r),
        None => ("closed", 0.0),
    };
    let line = serde_json::json!({
        "mode": mode, "offered_qps": offered, "connections": a.connections,
        "queries": n, "sent": seen.sent, "errors": seen.errors, "secs": secs, "qps": n as f64 / secs,
        "p50_us": q(0.5), "p99_us": q(0.99), "p999_us": q(0.999),
        "max_us": seen.latencies_us.last().copied().unwrap_or(0), "client_cores": client_cores,
    });
    println!("{line}");
    eprintln!(
        "load-http {mode} loop, {} connections: {n} queries in {secs:.1} s ({:.0}/s), {} errors, \
         p50 {} us, p99 {} us, p99.9 {} us (client used {client_cores:.2} cores)",
        a.connections,
        n as f64 / secs,
        seen.errors,
        q(0.5),
        q(0.99),
        q(0.999)
    );
}

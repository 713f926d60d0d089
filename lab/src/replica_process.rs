//! A replica as a separate `prefixlog serve` process, so that its RSS and CPU are its own (the
//! broker, the publisher and the gateways stay in the benchmark's process): `bench-rounds`,
//! `bench-scale` and `bench-facades`.

use crate::bench_env::BenchLog;
use anyhow::Context;
use prefixlog_proto::v1::{
    prefix_index_client::PrefixIndexClient, DescribeRequest, MatchRequest, PartitionOffset,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The replica process's flags of the benchmarks that start one.
#[derive(clap::Args)]
pub(crate) struct ReplicaArgs {
    /// An argument for the replica's `prefixlog serve`, repeatable (e.g. `--replica-arg=--query-copy`).
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) replica_arg: Vec<String>,
    /// The replica binary (default: `prefixlog` beside this program).
    #[arg(long, env = "PREFIXLOG_BIN")]
    pub(crate) replica_bin: Option<PathBuf>,
}

/// The replica binary: `given`, or `prefixlog` beside this program.
pub(crate) fn replica_bin(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let bin = match given {
        Some(b) => b.to_path_buf(),
        None => std::env::current_exe()?.with_file_name("prefixlog"),
    };
    anyhow::ensure!(
        bin.is_file(),
        "no replica binary at {} (build it: cargo build --release -p prefixlog, or pass --replica-bin)",
        bin.display()
    );
    Ok(bin)
}

/// A `prefixlog serve` child process on free loopback ports, killed when dropped.
pub(crate) struct ReplicaProcess {
    pub(crate) child: Child,
    pub(crate) endpoint: String,
    admin_port: u16,
}

impl ReplicaProcess {
    /// Starts `prefixlog serve` on `env`'s log, with `extra` arguments after the bench's own.
    pub(crate) fn start(bin: &Path, env: &BenchLog, data: &Path, extra: &[String]) -> anyhow::Result<Self> {
        // Three distinct free ports, held until just before the replica binds them.
        let held = [free_port()?, free_port()?, free_port()?];
        let port = |l: &TcpListener| l.local_addr().map(|a| a.port());
        let (grpc, admin, peer) = (port(&held[0])?, port(&held[1])?, port(&held[2])?);
        drop(held);
        let child = Command::new(bin)
            .arg("serve")
            .args(["--brokers", &env.spec.kafka.brokers, "--topic", &env.spec.topic])
            .args(["--partitions", &env.spec.partitions.to_string()])
            .arg("--data-dir")
            .arg(data)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(["--peer-addr", &format!("127.0.0.1:{peer}")])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self { child, endpoint: format!("http://127.0.0.1:{grpc}"), admin_port: admin })
    }

    /// Waits until the replica answers a query carrying `token` (it has applied everything the
    /// token names), for up to `limit`; fails at once if the replica exited.
    pub(crate) async fn wait_for(
        &mut self,
        token: &[PartitionOffset],
        probe: &MatchRequest,
        limit: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        let req = MatchRequest { min_offsets: token.to_vec(), timeout_us: 1_000_000, ..probe.clone() };
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("the replica exited ({status}) before applying the log; its log is on stderr");
            }
            anyhow::ensure!(Instant::now() < deadline, "the replica did not apply the log in {limit:?}");
            let Ok(mut c) = PrefixIndexClient::connect(self.endpoint.clone()).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            match c.r#match(req.clone()).await {
                Ok(_) => return Ok(()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Waits until the replica's `Describe` reports every offset of `token` applied, polling
    /// every 20 ms for up to `limit`: unlike [`Self::wait_for`] it asks no `Match`, so the
    /// replica's query latency histogram sees none of it. Returns when it saw them applied.
    pub(crate) async fn wait_applied(
        &mut self,
        token: &[PartitionOffset],
        limit: Duration,
    ) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + limit;
        let mut c = PrefixIndexClient::connect(self.endpoint.clone()).await?;
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("the replica exited ({status}) before applying the log; its log is on stderr");
            }
            anyhow::ensure!(Instant::now() < deadline, "the replica did not apply the log in {limit:?}");
            let applied = c.describe(DescribeRequest {}).await?.into_inner().applied;
            let reached = |t: &PartitionOffset| {
                applied.iter().any(|a| a.partition == t.partition && a.offset >= t.offset)
            };
            if token.iter().all(reached) {
                return Ok(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A field of the replica's `/proc/PID/status` (`VmRSS`, `RssAnon`), in MiB.
    pub(crate) fn status_mib(&self, field: &str) -> anyhow::Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {field} in /proc/PID/status"))?;
        Ok(kb / 1024.0)
    }

    /// The replica's CPU time so far, user and system, of every thread it ever ran
    /// (`/proc/PID/stat`: threads that exited are counted too), in USER_HZ ticks (100/s on
    /// Linux), so to 10 ms.
    pub(crate) fn cpu(&self) -> anyhow::Result<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // After the command name (in parentheses, which may hold spaces): field 3 onwards.
        let rest = stat.rsplit_once(')').context("no command name in /proc/PID/stat")?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks =
            |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).context("a short /proc/PID/stat");
        // utime and stime: fields 14 and 15, the 12th and 13th after the command name.
        Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
    }

    /// The replica's admin `/metrics` page.
    pub(crate) fn metrics(&self) -> anyhow::Result<String> {
        metrics_page(self.admin_port)
    }

    /// The replica's admin port.
    pub(crate) fn admin_port(&self) -> u16 {
        self.admin_port
    }

    /// The value of one gauge on the replica's admin `/metrics` (its first sample, labels
    /// ignored: a replica without shards has one, `shard="all"`).
    pub(crate) fn gauge(&self, name: &str) -> anyhow::Result<f64> {
        samples(&self.metrics()?, name)
            .next()
            .map(|(_, v)| v)
            .with_context(|| format!("no {name} on the replica's /metrics"))
    }
}

/// The `/metrics` page of the admin port on loopback `port`.
pub(crate) fn metrics_page(port: u16) -> anyhow::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

/// The samples of metric `name` on a `/metrics` page: (labels, value).
pub(crate) fn samples<'a>(page: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    page.lines().filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        Some((labels, value.trim().parse().ok()?))
    })
}

/// A histogram's cumulative bucket counts on a `/metrics` page, summed over its series:
/// (upper bound, count), ascending bounds, `+Inf` last.
pub(crate) fn histogram(page: &str, name: &str) -> Vec<(f64, f64)> {
    let bucket = format!("{name}_bucket");
    let mut sums: Vec<(f64, f64)> = Vec::new();
    for (labels, count) in samples(page, &bucket) {
        let Some(le) = labels.split(',').find_map(|kv| kv.trim().strip_prefix("le=")) else { continue };
        let le = le.trim_matches('"');
        let Ok(bound) = (if le == "+Inf" { Ok(f64::INFINITY) } else { le.parse::<f64>() }) else { continue };
        match sums.iter_mut().find(|(b, _)| *b == bound) {
            Some(s) => s.1 += count,
            None => sums.push((bound, count)),
        }
    }
    sums.sort_by(|a, b| a.0.total_cmp(&b.0));
    sums
}

/// The upper bound of the bucket holding the `q`-quantile of the observations made between
/// two scrapes of a histogram (`before`, `after`: [`histogram`]); None without observations.
pub(crate) fn bucket_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|&(le, n)| (le, n - before.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1)))
        .collect();
    let total = delta.last()?.1;
    (total > 0.0).then(|| delta.iter().find(|(_, n)| *n >= q * total).map_or(f64::INFINITY, |b| b.0))
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A listener on a free loopback port (the port is free again once it is dropped).
fn free_port() -> anyhow::Result<TcpListener> {
    Ok(TcpListener::bind("127.0.0.1:0")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP x\n\
        prefixlog_holder_blocks{shard=\"all\"} 42\n\
        lat_bucket{shard=\"all\",le=\"0.00001\"} 10\n\
        lat_bucket{shard=\"all\",le=\"0.00002\"} 90\n\
        lat_bucket{shard=\"all\",le=\"+Inf\"} 100\n\
        lat_count{shard=\"all\"} 100\n";

    #[test]
    fn reads_gauges_and_histogram_quantiles_between_scrapes() {
        assert_eq!(samples(PAGE, "prefixlog_holder_blocks").next(), Some(("shard=\"all\"", 42.0)));
        let after = histogram(PAGE, "lat");
        assert_eq!(after, vec![(0.00001, 10.0), (0.00002, 90.0), (f64::INFINITY, 100.0)]);
        // Two series: summed per bound.
        let two = format!(
            "{PAGE}lat_bucket{{shard=\"1\",le=\"0.00001\"}} 5\nlat_bucket{{shard=\"1\",le=\"+Inf\"}} 7\n"
        );
        assert_eq!(histogram(&two, "lat"), vec![(0.00001, 15.0), (0.00002, 90.0), (f64::INFINITY, 107.0)]);
        let before = vec![(0.00001, 10.0), (0.00002, 10.0), (f64::INFINITY, 10.0)];
        // 90 new observations, all in the second bucket or above: 80 there, 10 above.
        assert_eq!(bucket_quantile(&before, &after, 0.5), Some(0.00002));
        assert_eq!(bucket_quantile(&before, &after, 0.99), Some(f64::INFINITY));
        assert_eq!(bucket_quantile(&after, &after, 0.5), None);
    }
}

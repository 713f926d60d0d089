//! How a `prefixlog` or `prefixlog-lab` process starts and ends.

use prefixlog_ingest::CpuSet;

/// How log lines are written.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (log shippers).
    Json,
}

/// The flags every subcommand of both binaries takes.
#[derive(clap::Args, Debug)]
pub struct ProcessArgs {
    /// Log line format. The level is set by RUST_LOG (e.g. RUST_LOG=debug).
    #[arg(long, global = true, env = "PREFIXLOG_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// Starts a process: logging (`default_filter` unless RUST_LOG says otherwise), the
/// `--query-cpus` pinning, then the runtime (whose threads inherit the pinning).
pub fn start(
    args: &ProcessArgs,
    default_filter: &str,
    query_cpus: Option<&CpuSet>,
) -> anyhow::Result<tokio::runtime::Runtime> {
    init_logging(args.log_format, default_filter);
    pin_query_cpus(query_cpus)?;
    Ok(tokio::runtime::Runtime::new()?)
}

/// Logs to stderr in `format`; the level comes from RUST_LOG, else `default_filter`.
fn init_logging(format: LogFormat, default_filter: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => logs.json().init(),
    }
}

/// Pins the process to `--query-cpus` before its runtime starts: the runtime's threads, and
/// every thread started later, inherit the set.
fn pin_query_cpus(cpus: Option<&CpuSet>) -> anyhow::Result<()> {
    if let Some(cpus) = cpus {
        cpus.pin_current_thread()
            .map_err(|e| anyhow::anyhow!("--query-cpus {cpus}: cannot run on these CPUs: {e}"))?;
        tracing::info!(cpus = %cpus, "pinned the process to --query-cpus (the ingest thread re-pins to --ingest-cpus if set)");
    }
    Ok(())
}

/// At exit: replays and probes close their Kafka clients in the background, and none may be
/// mid-destroy when the process exits.
pub fn finish<T>(result: anyhow::Result<T>) -> anyhow::Result<T> {
    prefixlog_ingest::log_spec::wait_for_closing_clients();
    result
}

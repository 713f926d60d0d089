//! The demo's request stream: the trace's requests dealt to the gateways in turn, paced by
//! trace time (looped while a fault schedule runs).

use super::faults;
use indicatif::ProgressBar;
use prefixlog_workload::TraceRequest;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Deals the trace's requests to the gateways in turn at trace time / `speedup`. With a fault
/// clock, replays it in a loop (1 s of trace time between laps) until the schedule is over.
pub async fn replay(
    trace: &[TraceRequest],
    senders: &[mpsc::UnboundedSender<(usize, TraceRequest)>],
    speedup: f64,
    faults: Option<&faults::Clock>,
    bar: &ProgressBar,
) {
    let start = Instant::now();
    let t0 = trace.first().map_or(0, |r| r.timestamp_ms);
    let lap_ms = trace.last().map_or(0, |r| r.timestamp_ms.saturating_sub(t0)) + 1000;
    let mut i = 0;
    for lap in 0u64.. {
        for req in trace {
            if faults.is_some_and(faults::Clock::done) {
                return;
            }
            let at_ms = lap * lap_ms + req.timestamp_ms.saturating_sub(t0);
            let due = Duration::from_secs_f64(at_ms as f64 / 1000.0 / speedup);
            tokio::time::sleep_until((start + due).into()).await;
            let _ = senders[i % senders.len()].send((i, req.clone()));
            i += 1;
            if i as u64 > bar.length().unwrap_or(0) {
                bar.set_length(i as u64);
            }
        }
        if faults.is_none() {
            return;
        }
    }
}

//! The demo's results: per-request outcomes, the final table and the SVG plot.

use super::offload::TierHit;
use std::fmt::Write as _;

/// How a gateway's index query went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answered {
    Scores,
    Empty,
    Unavailable,
}

/// One routed request. Hits are split by tier; without a host tier every hit is on the GPU.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    pub blocks: u32,
    /// Blocks the worker the shared index chose already held.
    pub hit: TierHit,
    /// The best any worker held, by tier-weighted hit (perfect knowledge).
    pub oracle: TierHit,
    /// Blocks the gateway-local choice got, in the fleet routed by gateway-local trees.
    pub local: TierHit,
    pub query_us: u64,
    pub answered: Answered,
    /// A host block's weight in this run, per mille.
    pub host_weight: u32,
    /// The worker the shared index's choice went to, and the prompt's last local hash: what
    /// pairs the request with its placement in the log (`audit loss`).
    pub chosen: u32,
    pub prompt_tail: u64,
    /// The fault window the query started in (`--faults`; 0 otherwise).
    pub window: u8,
    /// Answered by a replica behind the gateway's own token, or flagged stale.
    pub stale: bool,
}

impl Outcome {
    /// Whether the chosen worker held less than the best one (perfect knowledge).
    pub fn lossy(&self) -> bool {
        self.hit.weighted(self.host_weight) < self.oracle.weighted(self.host_weight)
    }
}

/// Hit ratios weighed by tier (GPU 1.0, host `--host-weight`): with no host tier, the plain
/// hit ratios.
pub struct Ratios {
    pub shared: f64,
    pub oracle: f64,
    pub local: f64,
}

fn blocks(v: &[Outcome]) -> f64 {
    v.iter().map(|o| u64::from(o.blocks)).sum::<u64>().max(1) as f64
}

fn weighted(v: &[Outcome], f: fn(&Outcome) -> TierHit) -> f64 {
    v.iter().map(|o| f(o).weighted(o.host_weight)).sum::<u64>() as f64 / 1000.0 / blocks(v)
}

pub fn ratios(v: &[Outcome]) -> Ratios {
    Ratios {
        shared: weighted(v, |o| o.hit),
        oracle: weighted(v, |o| o.oracle),
        local: weighted(v, |o| o.local),
    }
}

/// "gpu / host" hit ratios of one column.
fn by_tier(v: &[Outcome], f: fn(&Outcome) -> TierHit) -> String {
    let b = blocks(v);
    let gpu: u64 = v.iter().map(|o| u64::from(f(o).gpu)).sum();
    let host: u64 = v.iter().map(|o| u64::from(f(o).host)).sum();
    format!("{:.3} / {:.3}", gpu as f64 / b, host as f64 / b)
}

pub fn percentile_ms(sorted_us: &[u64], q: f64) -> f64 {
    prefixlog_workload::quantile::nearest_rank(sorted_us, q).map_or(f64::NAN, |us| us as f64 / 1000.0)
}

/// Everything the final table shows besides the outcomes.
pub struct Summary {
    pub workers: usize,
    pub gateways: usize,
    pub seconds: f64,
    pub records_published: u64,
    /// The fleet spoke SMG's protocol: `records_published` counts acked SMG updates (the facade
    /// publishes no record for some, e.g. placements for event-fed workers).
    pub over_smg: bool,
    pub records_applied: Vec<u64>,
    pub points_compared: u64,
    pub mismatches: u64,
    pub rounds: u64,
    pub digests_equal: bool,
    pub caught_up: bool,
}

pub fn table(v: &[Outcome], s: &Summary) -> String {
    let r = ratios(v);
    let mut lat: Vec<u64> =
        v.iter().filter(|o| o.answered != Answered::Unavailable).map(|o| o.query_us).collect();
    lat.sort_unstable();
    let count = |a: Answered| v.iter().filter(|o| o.answered == a).count();
    let applied: u64 = s.records_applied.iter().sum();
    let mut t = String::new();
    let mut row = |k: &str, val: String| {
        let _ = writeln!(t, "| {k} | {val} |");
    };
    row("metric", "value".into());
    row("---", "---:".into());
    row(
        "requests routed",
        format!("{} ({} gateways, {} workers, {:.1} s)", v.len(), s.gateways, s.workers, s.seconds),
    );
    let tiered = v.iter().any(|o| o.hit.host + o.oracle.host + o.local.host > 0);
    let host_weight = v.first().map_or(0, |o| o.host_weight);
    let weighed = if tiered {
        format!(" (GPU 1.0, host {:.2})", f64::from(host_weight) / 1000.0)
    } else {
        String::new()
    };
    row(&format!("prefix-hit ratio{weighed}, shared index (achieved)"), format!("{:.3}", r.shared));
    row(&format!("prefix-hit ratio{weighed}, oracle (perfect knowledge)"), format!("{:.3}", r.oracle));
    row(&format!("prefix-hit ratio{weighed}, gateway-local trees"), format!("{:.3}", r.local));
    if tiered {
        row("hit ratio by tier (gpu / host), shared index", by_tier(v, |o| o.hit));
        row("hit ratio by tier (gpu / host), oracle", by_tier(v, |o| o.oracle));
        row("hit ratio by tier (gpu / host), gateway-local", by_tier(v, |o| o.local));
    }
    row("shared / oracle", format!("{:.3}", r.shared / r.oracle.max(f64::MIN_POSITIVE)));
    row(
        "index answers: scores / empty / unavailable (fail open)",
        format!(
            "{} / {} / {}",
            count(Answered::Scores),
            count(Answered::Empty),
            count(Answered::Unavailable)
        ),
    );
    row("query latency p50 (client, gRPC)", format!("{:.2} ms", percentile_ms(&lat, 0.5)));
    row("query latency p99 (client, gRPC)", format!("{:.2} ms", percentile_ms(&lat, 0.99)));
    if s.over_smg {
        row("SMG updates acked (KV events + placements)", s.records_published.to_string());
    } else {
        row("records published (KV events + placements)", s.records_published.to_string());
    }
    row(
        "records applied per replica",
        s.records_applied.iter().map(u64::to_string).collect::<Vec<_>>().join(" / "),
    );
    row(
        "records/s applied (both replicas; paced by the trace)",
        format!("{:.0}", applied as f64 / s.seconds.max(1e-9)),
    );
    row("anti-entropy rounds / points compared", format!("{} / {}", s.rounds, s.points_compared));
    row("anti-entropy mismatches", s.mismatches.to_string());
    row(
        "replicas caught up, engine digests equal",
        format!("{} / {}", yes(s.caught_up), yes(s.digests_equal)),
    );
    t
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

/// Which hit of an outcome a series plots (weighed by tier).
type Field = fn(&Outcome) -> TierHit;

/// Hit ratio over a moving window of `window` requests, one point per `step` requests.
fn series(v: &[Outcome], window: usize, step: usize, f: Field) -> Vec<(usize, f64)> {
    let mut out = Vec::new();
    let mut end = window.min(v.len());
    while end <= v.len() && end > 0 {
        let w = &v[end.saturating_sub(window)..end];
        let b: u64 = w.iter().map(|o| u64::from(o.blocks)).sum();
        let h: u64 = w.iter().map(|o| f(o).weighted(o.host_weight)).sum();
        out.push((end, h as f64 / 1000.0 / b.max(1) as f64));
        if end == v.len() {
            break;
        }
        end = (end + step).min(v.len());
    }
    out
}

/// A line plot of the three hit ratios over time (hand-written SVG).
pub fn svg(v: &[Outcome]) -> String {
    let (w, h, l, r, top, bot) = (760.0, 380.0, 60.0, 200.0, 30.0, 50.0);
    let window = (v.len() / 10).clamp(10, 300);
    let step = (v.len() / 200).max(1);
    let n = v.len().max(1) as f64;
    let x = |i: usize| l + (w - l - r) * i as f64 / n;
    let y = |p: f64| top + (h - top - bot) * (1.0 - p);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{l}" y="18" font-size="14">prefix-hit ratio, moving window of {window} requests</text>"#
    );
    for k in 0..=5 {
        let p = k as f64 / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{l}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{p:.1}</text>"##,
            w - r,
            l - 6.0,
            y(p) + 4.0,
            y = y(p)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">requests routed</text><text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
        (l + w - r) / 2.0,
        h - 12.0,
        w - r,
        h - bot + 16.0,
        v.len()
    );
    // The oracle is drawn last, dashed, on top: the shared index's line usually runs right on
    // it and would hide it otherwise.
    let lines: [(&str, &str, Field); 3] = [
        ("shared index", "#1f77b4", |o| o.hit),
        ("gateway-local", "#d62728", |o| o.local),
        ("oracle (thin, dashed)", "#2ca02c", |o| o.oracle),
    ];
    for (k, (name, color, f)) in lines.iter().enumerate() {
        let pts: Vec<String> =
            series(v, window, step, *f).iter().map(|&(i, p)| format!("{:.1},{:.1}", x(i), y(p))).collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" {} points="{}"/>"#,
            match k {
                0 => r#"stroke-width="5" stroke-opacity="0.6""#,
                2 => r#"stroke-width="1.5" stroke-dasharray="4 3""#,
                _ => r#"stroke-width="2""#,
            },
            pts.join(" ")
        );
        let ly = top + 20.0 * k as f64 + 10.0;
        let _ = writeln!(
            s,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{name}</text>"#,
            w - r + 15.0,
            w - r + 40.0,
            w - r + 46.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

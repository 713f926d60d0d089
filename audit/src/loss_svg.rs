//! Lost prefill tokens over time, one line per gateway, as a hand-written SVG plot (the layout
//! of `prefixlog-lab demo`'s hit-ratio chart): x is log time from the first bucket, y the lost
//! tokens per time bucket of the report.

use crate::loss::LossReport;
use std::fmt::Write as _;

/// Line colours, in gateway order (repeating past ten gateways).
const COLOURS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#17becf",
];

/// A round upper bound for the y axis (1, 2 or 5 × a power of ten, at least `max`).
fn nice_ceiling(max: u64) -> u64 {
    let mut step = 1u64;
    loop {
        for m in [1, 2, 5] {
            if step.saturating_mul(m) >= max {
                return step.saturating_mul(m).max(1);
            }
        }
        step = step.saturating_mul(10);
    }
}

/// The plot: one polyline per gateway through its lost tokens per bucket (0 for buckets it
/// had no placement in), a legend on the right.
pub fn svg(r: &LossReport) -> String {
    let (w, h, l, right, top, bot) = (760.0, 380.0, 70.0, 200.0, 30.0, 50.0);
    let buckets: Vec<u64> = r.by_bucket.keys().copied().collect();
    let (first, last) = (buckets.first().copied().unwrap_or(0), buckets.last().copied().unwrap_or(0));
    let span = (last - first).max(r.bucket_ms) as f64;
    let max = r.by_gateway_bucket.values().flat_map(|b| b.values()).map(|t| t.lost_tokens).max().unwrap_or(0);
    let ymax = nice_ceiling(max) as f64;
    let x = |t: u64| l + (w - l - right) * (t - first) as f64 / span;
    let y = |v: f64| top + (h - top - bot) * (1.0 - v / ymax);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{l}" y="18" font-size="14">lost prefill tokens per {:.0} s of log time, per gateway</text>"#,
        r.bucket_ms as f64 / 1000.0
    );
    for k in 0..=5 {
        let v = ymax * k as f64 / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{l}" x2="{}" y1="{yv:.1}" y2="{yv:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            w - right,
            l - 6.0,
            y(v) + 4.0,
            yv = y(v)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">log time (s from the first bucket)</text><text x="{}" y="{:.1}" text-anchor="end">{:.0}</text>"#,
        (l + w - right) / 2.0,
        h - 12.0,
        w - right,
        h - bot + 16.0,
        span / 1000.0
    );
    for (k, (gateway, per_bucket)) in r.by_gateway_bucket.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let pts: Vec<String> = buckets
            .iter()
            .map(|b| {
                let v = per_bucket.get(b).map_or(0, |t| t.lost_tokens) as f64;
                format!("{:.1},{:.1}", x(*b), y(v))
            })
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = top + 20.0 * k as f64 + 10.0;
        let _ = writeln!(
            s,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            w - right + 15.0,
            w - right + 40.0,
            w - right + 46.0,
            ly + 4.0,
            escape(gateway)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A gateway name as SVG text.
fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_are_round() {
        assert_eq!((nice_ceiling(0), nice_ceiling(1), nice_ceiling(3)), (1, 1, 5));
        assert_eq!((nice_ceiling(11), nice_ceiling(4_096)), (20, 5_000));
    }
}

//! One quantile rule for every latency and median the benchmarks print (the binary's
//! benchmarks, the demo's table, `bench/peers`): nearest rank over ascending samples.

use std::time::Duration;

/// The `q`-quantile (`0.0..=1.0`) of `sorted` (ascending) by nearest rank; `None` when empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    debug_assert!((0.0..=1.0).contains(&q), "quantile {q} outside 0..=1");
    let last = sorted.len().checked_sub(1)?;
    sorted.get((last as f64 * q).round() as usize).copied()
}

/// The `q`-quantile of `sorted` durations in µs; NaN when there are none (printed as such).
pub fn quantile_us(sorted: &[Duration], q: f64) -> f64 {
    nearest_rank(sorted, q).map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
}

/// The median of `xs` by the same nearest-rank rule; NaN when there are none.
pub fn median(xs: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = xs.into_iter().collect();
    v.sort_by(f64::total_cmp);
    nearest_rank(&v, 0.5).unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_picks_the_rounded_position() {
        let v: Vec<u32> = (0..=100).collect();
        assert_eq!(nearest_rank(&v, 0.5), Some(50));
        assert_eq!(nearest_rank(&v, 0.99), Some(99));
        assert_eq!(nearest_rank(&v, 1.0), Some(100));
        assert_eq!(nearest_rank(&[7u32], 0.99), Some(7));
        assert_eq!(nearest_rank::<u32>(&[], 0.5), None);
        assert!(quantile_us(&[], 0.5).is_nan());
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert!(median([]).is_nan());
        assert_eq!(quantile_us(&[Duration::from_micros(3)], 0.5), 3.0);
    }
}

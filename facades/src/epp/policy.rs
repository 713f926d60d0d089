//! The pick: the example gateway's policy (examples/gateway), on endpoints.
//!
//! Per endpoint, score = matched depth − `load_penalty` × requests this picker has in flight
//! there; the best score wins, ties to the least loaded, then to the next in a rotating order
//! (round-robin). If even the best depth covers less than `min_match` of the prompt's blocks
//! (say, only a system prompt every endpoint holds), or there are no depths (no prompt, or the
//! index unavailable), the least loaded wins instead, ties round-robin: new conversations
//! spread rather than pile onto the first holder of a shared prefix.
//!
//! Load is counted by the picker itself, not scraped: +1 when it routes a request, −1 when the
//! response ends or its stream goes away ([`Lease`]).

use super::Weights;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Why an endpoint was picked (the `route` label of the picks metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The best depth minus load, the depth covering at least `min_match` of the prompt.
    Index,
    /// The index answered but no match was long enough: least loaded.
    Balanced,
    /// No prompt to match (a request without body, or shorter than a block): least loaded.
    NoPrompt,
    /// The index was unavailable: least loaded.
    FailOpen,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Index => "index",
            Self::Balanced => "balanced",
            Self::NoPrompt => "no_prompt",
            Self::FailOpen => "fail_open",
        }
    }
}

/// What the index said for one request.
pub enum Depths {
    /// Per endpoint, its best matched depth in blocks (absent: 0), of `blocks` in the prompt.
    Matched {
        depth: HashMap<SocketAddr, u32>,
        blocks: usize,
    },
    NoPrompt,
    Unavailable,
}

/// Requests in flight per endpoint, and the round-robin turn. Cheap to clone.
#[derive(Clone, Default)]
pub struct Loads {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    in_flight: Mutex<HashMap<SocketAddr, u32>>,
    turn: AtomicUsize,
}

/// One routed request's place in its endpoint's load, given back when dropped.
pub struct Lease {
    loads: Loads,
    endpoint: SocketAddr,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut m = self.loads.inner.in_flight.lock();
        if let Some(n) = m.get_mut(&self.endpoint) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.endpoint);
            }
        }
    }
}

impl Lease {
    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }
}

impl Loads {
    /// Requests in flight at `e`.
    pub fn of(&self, e: &SocketAddr) -> u32 {
        self.inner.in_flight.lock().get(e).copied().unwrap_or(0)
    }

    /// Picks among `endpoints` (sorted, not empty) and counts the request there, under one
    /// lock so that concurrent picks see each other's load.
    pub fn pick(&self, endpoints: &[SocketAddr], depths: &Depths, w: &Weights) -> Option<(Lease, Route)> {
        if endpoints.is_empty() {
            return None;
        }
        let turn = self.inner.turn.fetch_add(1, Ordering::Relaxed) % endpoints.len();
        let order: Vec<SocketAddr> = endpoints[turn..].iter().chain(&endpoints[..turn]).copied().collect();
        let mut m = self.inner.in_flight.lock();
        let load: Vec<u32> = order.iter().map(|e| m.get(e).copied().unwrap_or(0)).collect();
        let (i, route) = choose(&order, &load, depths, w);
        *m.entry(order[i]).or_default() += 1;
        Some((Lease { loads: self.clone(), endpoint: order[i] }, route))
    }
}

/// The index into `order` of the pick (pure; `order` already rotated, not empty).
pub fn choose(order: &[SocketAddr], load: &[u32], depths: &Depths, w: &Weights) -> (usize, Route) {
    let (depth, blocks) = match depths {
        Depths::Matched { depth, blocks } => (depth, *blocks),
        Depths::NoPrompt => return (least_loaded(load), Route::NoPrompt),
        Depths::Unavailable => return (least_loaded(load), Route::FailOpen),
    };
    let d = |i: usize| depth.get(&order[i]).copied().unwrap_or(0);
    let score = |i: usize| f64::from(d(i)) - w.load_penalty * f64::from(load[i]);
    let mut best = 0;
    for i in 1..order.len() {
        // Strictly better only: among equals the first in the rotating order wins.
        let better = score(i).total_cmp(&score(best)).then(load[best].cmp(&load[i]));
        if better.is_gt() {
            best = i;
        }
    }
    if (d(best) as f64) < w.min_match * blocks as f64 || d(best) == 0 {
        return (least_loaded(load), Route::Balanced);
    }
    (best, Route::Index)
}

/// The first least-loaded index.
fn least_loaded(load: &[u32]) -> usize {
    (0..load.len()).min_by_key(|&i| load[i]).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, i], 8000))
    }

    fn matched(d: &[(u8, u32)], blocks: usize) -> Depths {
        Depths::Matched { depth: d.iter().map(|&(i, k)| (e(i), k)).collect(), blocks }
    }

    const W: Weights = Weights { load_penalty: 1.0, min_match: 0.5 };

    #[test]
    fn deepest_minus_load_then_least_loaded() {
        let order = [e(1), e(2), e(3)];
        assert_eq!(choose(&order, &[0, 0, 0], &matched(&[(2, 8)], 10), &W), (1, Route::Index));
        // 8 − 3 < 7 − 0.
        assert_eq!(choose(&order, &[0, 3, 0], &matched(&[(2, 8), (3, 7)], 10), &W), (2, Route::Index));
        // Tied depths: the less loaded.
        assert_eq!(choose(&order, &[1, 0, 0], &matched(&[(1, 8), (2, 8)], 10), &W).0, 1);
        // Tied scores and loads: the first in the rotating order.
        assert_eq!(choose(&order, &[0, 0, 0], &matched(&[(1, 8), (2, 8)], 10), &W).0, 0);
    }

    #[test]
    fn short_matches_and_no_index_balance() {
        let order = [e(1), e(2)];
        assert_eq!(choose(&order, &[0, 1], &matched(&[(2, 4)], 10), &W), (0, Route::Balanced));
        assert_eq!(choose(&order, &[2, 1], &Depths::Unavailable, &W), (1, Route::FailOpen));
        assert_eq!(choose(&order, &[0, 0], &Depths::NoPrompt, &W), (0, Route::NoPrompt));
    }

    #[test]
    fn leases_count_load_until_dropped_and_turns_rotate() {
        let loads = Loads::default();
        let eps = [e(1), e(2)];
        let (a, _) = loads.pick(&eps, &Depths::NoPrompt, &W).unwrap();
        let (b, _) = loads.pick(&eps, &Depths::NoPrompt, &W).unwrap();
        assert_ne!(a.endpoint(), b.endpoint(), "the second goes to the idle one");
        assert_eq!((loads.of(&e(1)), loads.of(&e(2))), (1, 1));
        drop(a);
        drop(b);
        assert_eq!((loads.of(&e(1)), loads.of(&e(2))), (0, 0));
        let firsts: Vec<SocketAddr> =
            (0..2).map(|_| loads.pick(&eps, &Depths::NoPrompt, &W).unwrap().0.endpoint()).collect();
        assert_ne!(firsts[0], firsts[1], "idle ties go round-robin");
        assert!(loads.pick(&[], &Depths::NoPrompt, &W).is_none());
    }
}

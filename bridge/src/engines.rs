//! Checks on the set of engines one bridge runs, before anything is published.
//!
//! Two engine streams that overlap would write the same events twice: under two workers (a
//! worker credited with blocks another worker holds, the overcount the index must never make),
//! or twice into one feed, where the two streams' sequence numbers read as duplicates and gaps
//! and a removal skipped as a "duplicate" leaves a block credited that is gone.

use super::EngineSpec;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;

/// Why a set of engines cannot run together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineConflict {
    /// Two subscriptions to one PUB endpoint whose topic prefixes overlap (one is a prefix of
    /// the other): every message matching both would be published twice.
    SameStream { endpoint: String, workers: (u64, u64), topics: (String, String) },
    /// One replay endpoint for two streams: one engine's history would be replayed into the
    /// other's feed.
    SameReplay { endpoint: String, workers: (u64, u64) },
    /// One worker's data-parallel rank named twice: two streams would write one feed.
    SameFeed { worker: u64, dp_rank: u32 },
}

impl fmt::Display for EngineConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SameStream { endpoint, workers, topics } => write!(
                f,
                "endpoint {endpoint} is given twice (worker {} topic {:?}, worker {} topic {:?}): \
                 its events would be published twice; give each engine stream once",
                workers.0, topics.0, workers.1, topics.1
            ),
            Self::SameReplay { endpoint, workers } => write!(
                f,
                "replay endpoint {endpoint} is given for two engines (workers {} and {}): one \
                 engine's history would be replayed into the other's feed",
                workers.0, workers.1
            ),
            Self::SameFeed { worker, dp_rank } => write!(
                f,
                "worker {worker} dp rank {dp_rank} is given twice: two engine streams would write \
                 one feed, and their sequence numbers would read as gaps and duplicates"
            ),
        }
    }
}

impl std::error::Error for EngineConflict {}

/// The first conflict between two of `engines`, if any. Endpoints are compared as written
/// (trimmed), so two spellings of one address are not caught. Engines of one worker without an
/// explicit `dp_rank` are not compared: each takes the rank its batches carry (vLLM's
/// data-parallel ranks say their own), which only the running streams know.
pub fn check_engines(engines: &[EngineSpec]) -> Result<(), EngineConflict> {
    for (i, a) in engines.iter().enumerate() {
        for b in &engines[i + 1..] {
            let topics_overlap = a.topic.starts_with(&b.topic) || b.topic.starts_with(&a.topic);
            if a.endpoint.trim() == b.endpoint.trim() && topics_overlap {
                return Err(EngineConflict::SameStream {
                    endpoint: a.endpoint.trim().to_string(),
                    workers: (a.worker, b.worker),
                    topics: (a.topic.clone(), b.topic.clone()),
                });
            }
            if let (Some(ra), Some(rb)) = (&a.replay_endpoint, &b.replay_endpoint) {
                if ra.trim() == rb.trim() {
                    return Err(EngineConflict::SameReplay {
                        endpoint: ra.trim().to_string(),
                        workers: (a.worker, b.worker),
                    });
                }
            }
            if let (Some(ra), Some(rb)) = (a.dp_rank, b.dp_rank) {
                if a.worker == b.worker && ra == rb {
                    return Err(EngineConflict::SameFeed { worker: a.worker, dp_rank: ra });
                }
            }
        }
    }
    Ok(())
}

/// Which engine stream writes each feed `(worker, dp rank)`, claimed by the first batch that
/// resolves to it. The start-up check cannot compare engines without an explicit `dp_rank`
/// (each takes the rank its batches carry); this catches two of them meeting in one feed while
/// they run. Shared by the engines of one bridge.
#[derive(Debug, Default)]
pub struct FeedClaims {
    owners: Mutex<HashMap<(u64, u32), String>>,
}

impl FeedClaims {
    /// Claims the feed for `stream` ([`EngineSpec::stream`]), or returns the stream that holds
    /// it.
    pub fn claim(&self, worker: u64, dp_rank: u32, stream: &str) -> Result<(), String> {
        let mut owners = self.owners.lock();
        let owner = owners.entry((worker, dp_rank)).or_insert_with(|| stream.to_string());
        if owner == stream {
            Ok(())
        } else {
            Err(owner.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(endpoint: &str, worker: u64, dp_rank: Option<u32>, topic: &str) -> EngineSpec {
        EngineSpec { endpoint: endpoint.into(), replay_endpoint: None, worker, dp_rank, topic: topic.into() }
    }

    #[test]
    fn distinct_streams_and_ranks_run_together() {
        let ok = [
            engine("tcp://h:5557", 5, None, ""),
            engine("tcp://h:5558", 5, Some(1), ""),
            engine("tcp://h:5559", 6, Some(1), ""),
            // One PUB endpoint, disjoint topic prefixes: disjoint messages.
            engine("tcp://g:5557", 7, None, "kv.a"),
            engine("tcp://g:5557", 8, None, "kv.b"),
            // Same worker, ranks left to the batches: vLLM's data-parallel ranks say their own.
            engine("tcp://k:5557", 9, None, ""),
            engine("tcp://k:5558", 9, None, ""),
        ];
        assert_eq!(check_engines(&ok), Ok(()));
        assert_eq!(check_engines(&[]), Ok(()));
    }

    #[test]
    fn one_stream_under_two_workers_is_refused() {
        let e = check_engines(&[engine("tcp://h:5557", 5, None, ""), engine(" tcp://h:5557", 6, None, "")]);
        assert_eq!(
            e,
            Err(EngineConflict::SameStream {
                endpoint: "tcp://h:5557".into(),
                workers: (5, 6),
                topics: (String::new(), String::new())
            })
        );
        // Overlapping prefixes: everything under "kv.a" matches both subscriptions.
        let e = check_engines(&[
            engine("tcp://h:5557", 5, None, "kv"),
            engine("tcp://h:5557", 5, Some(1), "kv.a"),
        ]);
        assert!(matches!(e, Err(EngineConflict::SameStream { .. })), "{e:?}");
        assert!(e.unwrap_err().to_string().contains("given twice"));
    }

    #[test]
    fn one_replay_endpoint_for_two_streams_is_refused() {
        let mut a = engine("tcp://h:5557", 5, None, "");
        let mut b = engine("tcp://h:5558", 6, None, "");
        a.replay_endpoint = Some("tcp://h:5600".into());
        b.replay_endpoint = Some("tcp://h:5601".into());
        assert_eq!(check_engines(&[a.clone(), b.clone()]), Ok(()));
        b.replay_endpoint = Some("tcp://h:5600 ".into());
        assert_eq!(
            check_engines(&[a, b]),
            Err(EngineConflict::SameReplay { endpoint: "tcp://h:5600".into(), workers: (5, 6) })
        );
    }

    #[test]
    fn a_feed_belongs_to_the_first_stream_that_writes_it() {
        let claims = FeedClaims::default();
        assert_eq!(claims.claim(5, 0, "tcp://a:1"), Ok(()));
        assert_eq!(claims.claim(5, 0, "tcp://a:1"), Ok(()));
        assert_eq!(claims.claim(5, 1, "tcp://b:1"), Ok(()));
        assert_eq!(claims.claim(6, 0, "tcp://b:1"), Ok(()));
        assert_eq!(claims.claim(5, 0, "tcp://b:1"), Err("tcp://a:1".to_string()));
        // Two streams of one endpoint under disjoint topics are two streams.
        let (a, b) = (engine("tcp://g:5557", 7, None, "kv.a"), engine("tcp://g:5557", 7, None, "kv.b"));
        assert_eq!(claims.claim(7, 0, &a.stream()), Ok(()));
        assert_eq!(claims.claim(7, 0, &b.stream()), Err(a.stream()));
    }

    #[test]
    fn one_rank_named_twice_is_refused() {
        let e = check_engines(&[
            engine("tcp://h:5557", 5, Some(0), ""),
            engine("tcp://h:5558", 6, Some(0), ""),
            engine("tcp://h:5559", 5, Some(0), ""),
        ]);
        assert_eq!(e, Err(EngineConflict::SameFeed { worker: 5, dp_rank: 0 }));
    }
}

//! The engine bridge end to end: a Python stand-in for vLLM / SGLang (pyzmq + msgpack,
//! `python/bridge_fixtures/publisher.py`) → `prefixlog_bridge` → Kafka (every available
//! backend) → a replica → `match_chain`. Covers both msgpack layouts, a gap answered over the
//! replay socket (complete, not gapped), losses that cannot be recovered (an unknown event
//! type, a gap without replay, an undecodable message: each clears the worker through a new
//! epoch and starts over, never gapped), refused events (an unknown field among them), a
//! cache-group lane, an engine restart (old blocks cleared), a bridge joining running engines
//! (replay from 0 recovers everything; a too-short replay buffer starts over where it reaches),
//! an engine restart the sequence numbers do not show (told through the replay socket), an
//! undecodable message (its reset goes to the stream's own dp rank), and two streams of one
//! worker without dp ranks meeting in one feed (the second one's batch is not published).
//!
//! Needs a Python with pyzmq and msgpack: `$PREFIXLOG_VENV/bin/python`, else
//! `~/.cache/prefixlog/venv/bin/python`, else `python3`. Without one the test prints
//! "NOT RUN: pyzmq not installed" and passes; `scripts/test.sh` installs them and sets
//! `PREFIXLOG_BRIDGE_E2E=required`, so in CI a missing Python fails instead.

use prefixlog_bridge::{self as bridge, BridgeOptions, EngineSpec};
use prefixlog_engine::scheme::block_hashes;
use prefixlog_engine::{HolderKey, KeyspaceId, MatchOptions};
use prefixlog_ingest::Publisher;
use prefixlog_node::ReplicaNode;
use prefixlog_proto::v1::{
    self, match_request::Prompt as PbPrompt, prefix_index_client::PrefixIndexClient, MatchRequest,
};
use prefixlog_tests::{kafka_backends, listen_port, replicas, unique_topic};
use std::time::{Duration, Instant};

const P: u32 = 4;
const BS: u32 = 4;

fn ks() -> KeyspaceId {
    KeyspaceId::new("bridge-model", BS, 1)
}

/// A Python that can import zmq and msgpack.
fn toks(base: u32, n: u32) -> Vec<u32> {
    (base..base + n).collect()
}

/// (depth, gapped) of a holder for a prompt.
fn probe(r: &ReplicaNode, holder: HolderKey, prompt: &[u32]) -> (u32, bool) {
    let a = r.applier().lock();
    let q = block_hashes(prompt, BS as usize);
    let opts = MatchOptions { lane: Some(holder.lane), ..Default::default() };
    let depth = a
        .engine()
        .match_chain(&ks(), &q, &opts)
        .unwrap_or_default()
        .iter()
        .find(|m| m.holder == holder)
        .map_or(0, |m| m.depth);
    let gapped = a.engine().keyspace(&ks()).and_then(|k| k.read().holder(&holder)).is_some_and(|h| h.gapped);
    (depth, gapped)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_engines_through_bridge_to_replica() {
    let Some(py) = prefixlog_tests::bridge_e2e_python("bridge e2e") else { return };
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.bridge");
        b.create_topic(&topic, P).await.unwrap();
        let spec = replicas::spec(&b.brokers, &topic, P);
        let r = replicas::replica(&spec, "bridge").await;
        let publisher = Publisher::new(&spec).unwrap();
        let [pa, pa_replay, pb, pc, pc_replay, dead, pd, pd_replay, pe, pe_replay, pf, pf_replay, pj, pk, pl] =
            [(); 15].map(|_| listen_port());
        let ep = |p: u16| format!("tcp://127.0.0.1:{p}");
        let engines = vec![
            EngineSpec {
                endpoint: ep(pa),
                replay_endpoint: Some(ep(pa_replay)),
                worker: 1,
                dp_rank: None,
                topic: String::new(),
            },
            EngineSpec {
                endpoint: ep(pb),
                // A replay endpoint nobody listens on: the replay fails, the gap is published.
                replay_endpoint: Some(ep(dead)),
                worker: 2,
                dp_rank: None,
                topic: String::new(),
            },
            EngineSpec {
                endpoint: ep(pc),
                replay_endpoint: Some(ep(pc_replay)),
                worker: 3,
                dp_rank: None,
                topic: String::new(),
            },
            EngineSpec {
                endpoint: ep(pd),
                replay_endpoint: Some(ep(pd_replay)),
                worker: 4,
                dp_rank: None,
                topic: String::new(),
            },
            EngineSpec {
                endpoint: ep(pe),
                replay_endpoint: Some(ep(pe_replay)),
                worker: 5,
                dp_rank: None,
                topic: String::new(),
            },
            EngineSpec {
                endpoint: ep(pf),
                replay_endpoint: Some(ep(pf_replay)),
                worker: 6,
                dp_rank: None,
                topic: String::new(),
            },
            // J and K: one worker, no dp rank, batches without one: two streams for one feed.
            EngineSpec {
                endpoint: ep(pj),
                replay_endpoint: None,
                worker: 7,
                dp_rank: None,
                topic: String::new(),
            },
            EngineSpec {
                endpoint: ep(pk),
                replay_endpoint: None,
                worker: 7,
                dp_rank: None,
                topic: String::new(),
            },
            // L: no replay socket; every loss clears the worker and starts over.
            EngineSpec {
                endpoint: ep(pl),
                replay_endpoint: None,
                worker: 8,
                dp_rank: None,
                topic: String::new(),
            },
        ];
        let mut opts = BridgeOptions::new(ks());
        // Generous, CI is a loaded 2-core machine: a stalled publisher must not look idle (a
        // spurious re-subscribe loses live batches: extra gaps), nor a slow replay failed.
        // idle_reconnect is also how C and F's restarts are found: each costs up to 3 s.
        opts.idle_reconnect = Duration::from_secs(3);
        opts.log_interval = Duration::ZERO;
        opts.replay_timeout = Duration::from_secs(10);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let exported = std::sync::Arc::new(bridge::metrics::BridgeCollector::default());
        let registry = prometheus::Registry::new();
        exported.register(&registry).unwrap();
        let bridge_task = {
            let exported = exported.clone();
            tokio::spawn(async move { bridge::run(engines, opts, publisher, true, stop_rx, &exported).await })
        };

        let mut args = vec!["serve".to_string()];
        for (flag, port) in [
            ("--a", pa),
            ("--a-replay", pa_replay),
            ("--b", pb),
            ("--c", pc),
            ("--c-replay", pc_replay),
            ("--d", pd),
            ("--d-replay", pd_replay),
            ("--e", pe),
            ("--e-replay", pe_replay),
            ("--f", pf),
            ("--f-replay", pf_replay),
            ("--j", pj),
            ("--k", pk),
            ("--l", pl),
        ] {
            args.extend([flag.to_string(), port.to_string()]);
        }
        prefixlog_tests::run_bridge_publisher(&py, &args, b.name).await;

        let a_prompt = toks(1000, 20);
        let b_prompt = toks(2000, 12);
        let (c_old, c_new) = (toks(3000, 12), toks(4000, 8));
        let want = [
            // A: seq 2 lost live, recovered over the replay socket: whole chain, not gapped.
            (HolderKey::new(1, 0, 0), a_prompt.clone(), (5, false)),
            // B (dp 1 from the map batches): its chain of 3, and the group_idx 1 store on lane 1.
            (HolderKey::new(2, 1, 0), b_prompt.clone(), (3, false)),
            (HolderKey::new(2, 1, 1), b_prompt[..4].to_vec(), (1, false)),
            // C: restarted: the old chain is cleared by the new epoch, the new one is held.
            (HolderKey::new(3, 0, 0), c_old.clone(), (0, false)),
            (HolderKey::new(3, 0, 0), c_new.clone(), (2, false)),
            // D: joined after seq 0-4, all recovered by replay from 0.
            (HolderKey::new(4, 0, 0), toks(5000, 24), (6, false)),
            // E: when the replay was asked, the 2-batch ring buffer held seq 3-4 (4 had just been
            // published): seq 0-2 cannot be recovered, so the worker started over at seq 3 (a new
            // epoch): 3 replayed, 4 live; not gapped.
            (HolderKey::new(5, 0, 0), toks(6000, 4), (0, false)),
            (HolderKey::new(5, 0, 0), toks(6008, 4), (0, false)),
            (HolderKey::new(5, 0, 0), toks(6012, 4), (1, false)),
            (HolderKey::new(5, 0, 0), toks(6016, 4), (1, false)),
            // F: restarted past its old last seq: told by the replayed copy; old chain cleared.
            (HolderKey::new(6, 0, 0), toks(7000, 8), (0, false)),
            (HolderKey::new(6, 0, 0), toks(8000, 20), (5, false)),
            // L: an unknown event type, a lost batch, an undecodable message: each cleared the
            // worker (its removal may be among them); only the store after the last is held.
            (HolderKey::new(8, 1, 0), toks(9700, 4), (0, false)),
            (HolderKey::new(8, 1, 0), toks(9704, 4), (0, false)),
            (HolderKey::new(8, 1, 0), toks(9708, 4), (0, false)),
            (HolderKey::new(8, 1, 0), toks(9712, 4), (0, false)),
            (HolderKey::new(8, 1, 0), toks(9716, 4), (1, false)),
        ];
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got: Vec<_> = want.iter().map(|(h, p, _)| probe(&r, *h, p)).collect();
            let expected: Vec<_> = want.iter().map(|w| w.2).collect();
            if got == expected {
                break;
            }
            assert!(Instant::now() < deadline, "{}: replica state {got:?}, want {expected:?}", b.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // J and K: J wrote first and holds the feed (7, 0); K's batch was not published.
        let (j_prompt, k_prompt) = (toks(9000, 8), toks(9500, 4));
        let deadline = Instant::now() + Duration::from_secs(30);
        while probe(&r, HolderKey::new(7, 0, 0), &j_prompt).0 != 2 {
            assert!(Instant::now() < deadline, "{}: J's blocks applied", b.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(probe(&r, HolderKey::new(7, 0, 0), &k_prompt), (0, false), "{}: K", b.name);
        // L's undecodable message went to L's feed (dp 1), not to a feed of dp rank 0.
        {
            let a = r.applier().lock();
            let feeds = &a.partition(prefixlog_engine::partition_of(8, P)).feeds;
            assert!(!feeds.keys().any(|k| k.worker == 8 && k.dp_rank == 0), "{}: a (8, 0) feed", b.name);
        }
        // The same scores through the replica's gRPC query service, prompts as token ids.
        let mut client = PrefixIndexClient::connect(r.endpoint()).await.unwrap();
        // The depth gRPC reports for `h` on a token prompt in a namespace ("" = base model).
        let mut depth_of = async |h: HolderKey, ids: &[u32], namespace: &str| {
            let req = MatchRequest {
                keyspace: Some(v1::Keyspace { model: "bridge-model".into(), block_size: BS, hash_scheme: 1 }),
                prompt: Some(PbPrompt::Tokens(v1::TokenIds {
                    ids: ids.to_vec(),
                    namespace: namespace.into(),
                    ..Default::default()
                })),
                lane: Some(h.lane),
                ..Default::default()
            };
            let resp = client.r#match(req).await.unwrap().into_inner();
            resp.scores
                .iter()
                .find(|s| (s.worker, s.dp_rank, s.lane) == (h.worker, h.dp_rank, h.lane))
                .map_or(0, |s| s.depth)
        };
        for (h, prompt, (depth, _)) in &want {
            assert_eq!(depth_of(*h, prompt, "").await, *depth, "{}: gRPC score of {h}", b.name);
        }
        // B's block stored under LoRA adapter "adapter" matches only prompts under that adapter:
        // depth 1 there (its one block), not credited to any other namespace's prompt.
        for (namespace, want_depth) in [("adapter", 1), ("other-adapter", 0)] {
            let got = depth_of(HolderKey::new(2, 1, 0), &b_prompt, namespace).await;
            assert_eq!(got, want_depth, "{}: B under namespace {namespace:?}", b.name);
        }
        // B's CPU-medium store (ext 98, B's first block) is on the host tier: a query counting
        // only the host finds it there; one counting only the GPU sees the GPU chain.
        for (tiers, want) in [(vec![v1::StorageTier::Host], (1, 1)), (vec![v1::StorageTier::Gpu], (3, 0))] {
            let req = MatchRequest {
                keyspace: Some(v1::Keyspace { model: "bridge-model".into(), block_size: BS, hash_scheme: 1 }),
                prompt: Some(PbPrompt::Tokens(v1::TokenIds { ids: b_prompt.clone(), ..Default::default() })),
                lane: Some(0),
                tiers: tiers.iter().map(|&t| t as i32).collect(),
                ..Default::default()
            };
            let resp = client.r#match(req).await.unwrap().into_inner();
            let s = resp.scores.iter().find(|s| (s.worker, s.dp_rank) == (2, 1)).expect("B scored");
            let host_run =
                s.runs.iter().filter(|r| r.tier == v1::StorageTier::Host as i32).map(|r| r.blocks).sum();
            assert_eq!((s.depth, host_run), want, "{}: B on tiers {tiers:?}: {s:?}", b.name);
        }
        // Lane metadata announced by the bridge for engine B's cache group 1.
        {
            let a = r.applier().lock();
            let feeds = &a.partition(prefixlog_engine::partition_of(2, P)).feeds;
            let feed = feeds
                .iter()
                .find(|(k, _)| k.worker == 2 && k.dp_rank == 1)
                .map(|(_, f)| f)
                .expect("feed of B");
            let m = feed.lane_meta.get(&1).expect("lane 1 metadata");
            assert_eq!(
                (m.kind.as_str(), m.sliding_window, m.block_size),
                ("sliding_window", 128, BS),
                "{}",
                b.name
            );
        }
        stop_tx.send(true).unwrap();
        let metrics =
            tokio::time::timeout(Duration::from_secs(30), bridge_task).await.unwrap().unwrap().unwrap();
        let text = prefixlog_query::metrics::render(&registry);
        assert!(text.contains("# TYPE prefixlog_bridge_events_received_total counter"), "{text}");
        assert!(text.contains("prefixlog_bridge_gaps_total{endpoint=\""), "{text}");
        assert!(text.contains("prefixlog_bridge_publish_latency_seconds_count{endpoint="), "{text}");
        let get = |w: u64, name: &str| {
            metrics.iter().find(|(s, _)| s.worker == w).and_then(|(_, m)| m.get(name)).unwrap_or(0)
        };
        assert_eq!(
            (get(1, "gaps"), get(1, "replays_ok"), get(1, "replayed_batches"), get(1, "resets_gap")),
            (1, 1, 1, 0),
            "{}: A",
            b.name
        );
        assert_eq!(get(1, "fields_ignored"), 0, "{}: A sends only known fields", b.name);
        // B: refusals, and its one unknown field (the store carrying it refused).
        assert_eq!(
            (
                get(2, "refused_token_count"),
                get(2, "refused_medium"),
                get(2, "refused_unknown_field"),
                get(2, "fields_ignored")
            ),
            (1, 1, 1, 1),
            "{}: B",
            b.name
        );
        assert_eq!((get(2, "gaps"), get(2, "resets_gap"), get(2, "resets_lost")), (0, 0, 0), "{}: B", b.name);
        // L: the unknown event type and the undecodable message (lost), the gap without replay.
        assert_eq!(
            (
                get(8, "events_unknown_type"),
                get(8, "messages_undecodable"),
                get(8, "gaps"),
                get(8, "resets_lost"),
                get(8, "resets_gap")
            ),
            (1, 1, 1, 2, 1),
            "{}: L",
            b.name
        );
        assert_eq!(get(3, "epochs"), 1, "{}: C restarted once", b.name);
        assert_eq!(
            (get(4, "gaps"), get(4, "replayed_batches"), get(4, "resets_gap")),
            (1, 5, 0),
            "{}: D",
            b.name
        );
        assert_eq!(
            (get(5, "gaps"), get(5, "replayed_batches"), get(5, "resets_gap")),
            (1, 1, 1),
            "{}: E",
            b.name
        );
        assert_eq!(get(3, "resets_gap"), 0, "{}", b.name);
        assert_eq!(get(3, "events_published"), 6, "{}: 3 stores + 1 removal, then 2 stores", b.name);
        assert_eq!(
            (
                get(6, "epochs"),
                get(6, "gaps"),
                get(6, "replays_ok"),
                get(6, "replayed_batches"),
                get(6, "resets_gap")
            ),
            (1, 1, 2, 4, 0),
            "{}: F",
            b.name
        );
        assert!(metrics.iter().all(|(_, m)| m.get("publish_errors") == Some(0)));
        let taken = |port: u16| {
            metrics
                .iter()
                .find(|(s, _)| s.endpoint == ep(port))
                .and_then(|(_, m)| m.get("batches_feed_taken"))
        };
        assert_eq!((taken(pj), taken(pk)), (Some(0), Some(1)), "{}: J's feed, K refused", b.name);
        // Clean shutdown with remove_on_exit: worker-removed drops every holder of the workers.
        let deadline = Instant::now() + Duration::from_secs(30);
        while probe(&r, HolderKey::new(1, 0, 0), &a_prompt).0 != 0 {
            assert!(Instant::now() < deadline, "{}: worker-removed applied", b.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

//! The settings that decide applied state travel with the log (issue 14 item 2): a replica
//! refuses a checkpoint applied with other settings (naming the differences) unless told to
//! replay the log with its new ones; an audit applies the settings of the checkpoint it starts
//! from, whatever its own flags say. (Anti-entropy's "settings differ" outcome is in
//! tests/antientropy.rs.)

use prefixlog_audit::{reconstruct, Point};
use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{KafkaConnection, LogSpec, Publisher};
use prefixlog_node::{CheckpointPolicy, NodeError, NodeOptions, ReplicaNode, SettingsChange, StateSource};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::BlockHashes;
use prefixlog_state::{token_of, KvOp, StateSettings, Tier};
use prefixlog_tests::{kafka_backends, unique_topic};
use std::time::Duration;

const P: u32 = 2;

fn opts(dir: &std::path::Path) -> NodeOptions {
    NodeOptions {
        replica_id: "s".into(),
        admin_addr: None,
        data_dir: Some(dir.to_path_buf()),
        checkpoints: CheckpointPolicy { interval: Duration::ZERO, records: 0, ..Default::default() },
        ..NodeOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_of_other_settings_is_refused_replayed_on_request_and_audited_with_its_own() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.settings");
        b.create_topic(&topic, P).await.unwrap();
        let spec = LogSpec::new(KafkaConnection::new(&b.brokers), &topic, P);
        let publisher = Publisher::new(&spec).unwrap();
        let mut landed = Vec::new();
        for w in 0..6u64 {
            let ops = [KvOp::Stored {
                tier: Tier::Gpu,
                lane: 0,
                parent_ext: None,
                blocks: [(w << 8 | 1, 1)].map(BlockHashes::from).to_vec(),
            }];
            landed.push(
                publisher
                    .publish_kv_events(&KeyspaceId::new("m", 16, 1), w, 0, 1, 1, false, &ops, None)
                    .await
                    .unwrap(),
            );
        }
        let token = token_of(&landed);
        let d = tempfile::tempdir().unwrap();
        let a = ReplicaNode::start(spec.clone(), opts(d.path())).await.unwrap();
        assert!(a.status().wait_for(&token, Duration::from_secs(30)).await);
        a.checkpoint_now().unwrap();
        a.kill().await;

        let other =
            spec.clone().with_settings(StateSettings { placement_ttl_ms: 7_000, ..Default::default() });
        let err = ReplicaNode::start(other.clone(), opts(d.path())).await.err().expect("refused");
        assert!(matches!(err, NodeError::SettingsChanged { .. }), "{}: {err}", b.name);
        assert!(err.to_string().contains("placement_ttl_ms 7000 vs 120000"), "{err}");
        assert!(err.to_string().contains("--replay-on-settings-change"), "{err}");

        let o = NodeOptions { settings_change: SettingsChange::Replay, ..opts(d.path()) };
        let r = ReplicaNode::start(other.clone(), o).await.unwrap();
        assert_eq!(r.source(), &StateSource::LogStart, "{}: replayed with the new settings", b.name);
        assert!(r.status().wait_for(&token, Duration::from_secs(30)).await);
        assert_eq!(r.applier().lock().settings().placement_ttl_ms, 7_000);
        r.kill().await;

        // An audit started with other flags applies the checkpoint's settings.
        let store = CheckpointStore::open_reader(&d.path().join("checkpoints")).unwrap();
        let at = reconstruct(Some(&store), &other, &Point::Offsets(token.clone()), false).unwrap();
        assert!(at.checkpoint.is_some(), "{}: started from the checkpoint", b.name);
        assert_eq!(at.applier.settings(), &StateSettings::default(), "{}", b.name);

        // Once a checkpoint with the new settings exists, a plain restart restores it: the
        // older checkpoint with the old settings (still retained) is history, not a refusal.
        let o = NodeOptions { settings_change: SettingsChange::Replay, ..opts(d.path()) };
        let r = ReplicaNode::start(other.clone(), o).await.unwrap();
        assert!(r.status().wait_for(&token, Duration::from_secs(30)).await);
        let newest = r.checkpoint_now().unwrap().expect("a checkpoint store");
        r.kill().await;
        let r =
            ReplicaNode::start(other.clone(), opts(d.path())).await.expect("the newest checkpoint matches");
        assert_eq!(r.source(), &StateSource::LocalCheckpoint(newest.id), "{}", b.name);
        assert_eq!(r.applier().lock().settings().placement_ttl_ms, 7_000);
        r.kill().await;
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

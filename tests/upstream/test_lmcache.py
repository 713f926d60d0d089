"""LMCache's own cache-event emission, from the released wheel, read by `prefixlog lmcache-bridge`.

LMCache 0.5.6's `CacheEventSubscriber` (its MP server's side: token bindings stamped onto store
entries, seq numbering, batching) is driven with the bus events its storage layer emits, and
delivers through its `KafkaCacheEventSink` to a topic on the replica's embedded broker. Chunk
hashes come from LMCache's `TokenHasher` (blake3, its default). The bridge translates; answers
come from the replica over gRPC (the project's Python client) on the LMCache tiers: host (L1
dram) and external (L2).
"""

from __future__ import annotations

import importlib
import types

import pytest

import upstream_loader as ul
from conftest import Process, Replica, free_port, metric, wait_for

ul.package(
    "lmcache",
    real=[
        "lmcache.v1.distributed.api",
        "lmcache.v1.distributed.internal_api",
        "lmcache.v1.mp_coordinator.api",
        "lmcache.v1.mp_coordinator.schemas",
        "lmcache.v1.mp_coordinator.cache_events",
        "lmcache.v1.mp_coordinator.views.key_directory",
        "lmcache.v1.mp_observability.event",
        "lmcache.v1.mp_observability.event_bus",
        "lmcache.v1.multiprocess.token_hasher",
    ],
)
api = importlib.import_module("lmcache.v1.distributed.api")
internal = importlib.import_module("lmcache.v1.distributed.internal_api")
events = importlib.import_module("lmcache.v1.mp_observability.event")
cache_events = importlib.import_module("lmcache.v1.mp_coordinator.cache_events")
coordinator_api = importlib.import_module("lmcache.v1.mp_coordinator.api")
token_hasher = importlib.import_module("lmcache.v1.multiprocess.token_hasher")

from prefixlog_client import IndexClient  # noqa: E402

CHUNK = 16
MODEL = "meta-llama/Llama-3.1-8B"
KEYSPACE = (MODEL, CHUNK, 1)
TOPIC = "lmcache.cache-events"
WORKERS = {"mp-a": 101, "mp-b": 102}


class Emitter:
    """One LMCache MP server's event emission: LMCache's subscriber and Kafka sink, fed the
    bus events its store path and storage layer publish."""

    def __init__(self, brokers: str, instance: str, incarnation: int):
        config = types.SimpleNamespace(bootstrap_servers=brokers, topic=TOPIC, delivery_timeout=30.0)
        self.sink = cache_events.KafkaCacheEventSink(config)
        # flush_interval 0: every event is flushed (one batch, one Kafka record) at once.
        self.sub = cache_events.CacheEventSubscriber(self.sink, instance, incarnation, flush_interval=0)
        self.on = self.sub.get_subscriptions()
        self.hasher = token_hasher.TokenHasher(chunk_size=CHUNK, hash_algorithm="blake3")

    def keys(self, tokens, first=0):
        hashes = self.hasher.compute_chunk_hashes(list(tokens))[first:]
        rank = api.ObjectKey.ComputeKVRank(world_size=1, global_rank=0, local_world_size=1, local_rank=0)
        return [api.ObjectKey(chunk_hash=h, model_name=MODEL, kv_rank=rank) for h in hashes]

    def emit(self, kind, **metadata):
        self.on[kind](events.Event(event_type=kind, metadata=metadata))

    def store_l1(self, tokens, first=0):
        """A store of chunks `first..` of `tokens`: the token bindings published at submission
        (MP_TOKENS), then the L1 write-finished event."""
        keys = self.keys(tokens, first)
        offsets = [CHUNK * (first + i) for i in range(len(keys))]
        self.emit(events.EventType.MP_TOKENS, chunk_hashes=[k.chunk_hash for k in keys],
                  token_chunks=[list(tokens[o:o + CHUNK]) for o in offsets], token_offsets=offsets,
                  parent_hashes=[None] * len(keys))
        meta = [internal.L1ObjectMeta(size_bytes=4096, backend=api.L1BackendType.DRAM) for _ in keys]
        self.emit(events.EventType.L1_WRITE_FINISHED, keys=keys, meta=meta)

    def store_l2(self, tokens, chunks, backend="fs"):
        keys = self.keys(tokens)[:chunks]
        self.emit(events.EventType.L2_KEYS_STORED, keys=keys, sizes=[4096] * len(keys), backend=backend)

    def evict_l1(self, tokens, first):
        keys = self.keys(tokens, first)
        meta = [internal.L1ObjectMeta(size_bytes=4096, backend=api.L1BackendType.DRAM) for _ in keys]
        self.emit(events.EventType.L1_KEYS_EVICTED, keys=keys, meta=meta)

    def close(self):
        self.sub.shutdown()


def prompt(base: int, chunks: int) -> list[int]:
    return [base + i for i in range(chunks * CHUNK)]


def depths(client, tokens) -> dict:
    """{instance: (depth, {tier: its depth})} of the LMCache workers holding a prefix."""
    r = client.match(KEYSPACE, tokens=tokens)
    assert r.outcome in ("scores", "empty"), r
    by_worker = {w: i for i, w in WORKERS.items()}
    return {by_worker[s.worker]: (s.depth, {t: d for t, d, _ in s.tiers if d}) for s in r.scores if s.worker in by_worker}


def expect(client, tokens, want, what):
    wait_for(what, lambda: depths(client, tokens) == want, timeout=60)


def start_bridge(replica: Replica, name: str) -> tuple[Process, int]:
    admin_port = free_port()
    args = ["lmcache-bridge", "--brokers", replica.brokers, "--partitions", str(replica.partitions),
            "--lmcache-topic", TOPIC, "--chunk-size", str(CHUNK), "--admin-addr", f"127.0.0.1:{admin_port}",
            "--wait-for-topic", "60s"]
    for instance, worker in WORKERS.items():
        args += ["--instance", f"{instance}={worker}"]
    return Process(name, args), admin_port


def scrape(port: int, name: str, **labels) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return metric(r.read().decode(), name, **labels)


def test_lmcache_sink_stores_and_removals_answer_on_the_lmcache_tiers(processes):
    replica = Replica("replica")
    processes.append(replica)
    # The topic is created by LMCache's producer on its first record (the embedded broker
    # creates topics on use; it answers no admin requests); the bridge waits for it.
    bridge, admin_port = start_bridge(replica, "lmcache-bridge")
    processes.append(bridge)

    def bridge_metric(name, **labels):
        return scrape(admin_port, name, **labels)

    p = prompt(1000, 4)
    q = p[: 2 * CHUNK] + prompt(5000, 1)
    a = Emitter(replica.brokers, "mp-a", incarnation=1_000)
    b = Emitter(replica.brokers, "mp-b", incarnation=2_000)
    a.store_l1(p)  # 4 chunks on a's L1
    a.store_l2(p, 2)  # its first 2 also on a's L2 (fs)
    b.store_l1(p[: 2 * CHUNK])  # b: the shared first 2 chunks ...
    b.store_l1(q, first=2)  # ... then q's own third chunk, a later store under them
    a.sink.close()
    b.sink.close()

    with IndexClient([replica.grpc], deadline=5.0) as client:
        expect(client, p, {"mp-a": (4, {"host": 4, "external": 2}), "mp-b": (2, {"host": 2})}, "p on both instances")
        expect(client, q, {"mp-a": (2, {"host": 2, "external": 2}), "mp-b": (3, {"host": 3})}, "q on both")

        # a evicts its last two chunks from L1; its L2 copies of the first two stay.
        a.evict_l1(p, first=2)
        a.sink.close()
        expect(client, p, {"mp-a": (2, {"host": 2, "external": 2}), "mp-b": (2, {"host": 2})}, "a's eviction")

        # LMCache's sink delivers a batch again (a retry after an uncertain publish): the
        # bridge's gate drops it, the answer does not move.
        entry = coordinator_api.CacheEventEntry(key=a.keys(p)[3].to_encoded_object_key(), size_bytes=1,
                                                token_ids=p[3 * CHUNK:], token_offset=3 * CHUNK)
        again = coordinator_api.CacheEventBatch(instance_id="mp-a", incarnation=1_000, seq=1,
                                                event_type=coordinator_api.CacheEventType.STORE,
                                                tier=api.Tier.L1, backend="dram", entries=[entry])
        a.sink.publish([again])
        a.sink.close()
        wait_for("the duplicate dropped", lambda: bridge_metric("prefixlog_lmcache_bridge_batches_total", outcome="duplicate") >= 1)
        assert depths(client, p)["mp-a"] == (2, {"host": 2, "external": 2})

        # a restarts (a new incarnation): its old L1 chunks are void, its L2 ones stay.
        a2 = Emitter(replica.brokers, "mp-a", incarnation=1_001)
        r = prompt(9000, 1)
        a2.store_l1(r)
        a2.sink.close()
        expect(client, p, {"mp-a": (2, {"external": 2}), "mp-b": (2, {"host": 2})}, "a's restart fencing its L1")
        expect(client, r, {"mp-a": (1, {"host": 1})}, "a's new incarnation's store")
        # A batch of the old incarnation arriving late is fenced out.
        a.store_l1(prompt(7000, 1))
        a.sink.close()
        wait_for("the stale batch dropped", lambda: bridge_metric("prefixlog_lmcache_bridge_batches_total", outcome="stale") >= 1)
        assert depths(client, prompt(7000, 1)) == {}

        assert bridge_metric("prefixlog_lmcache_bridge_entries_refused_total") == 0
        assert metric(replica.metrics(), "prefixlog_records_skipped_total") == 0
        answers = {name: depths(client, t) for name, t in (("p", p), ("q", q), ("r", r))}

        # The bridge restarts: it reads the topic from its start again and republishes each
        # instance's newest incarnation under the same (epoch, seq). The replica drops them as
        # duplicates; nothing reaches it under an older epoch (which would mark mp-a gapped).
        read = bridge_metric("prefixlog_lmcache_bridge_records_total", outcome="read")
        bridge.stop()
        again, again_port = start_bridge(replica, "lmcache-bridge-again")
        processes.append(again)
        wait_for("the restarted bridge read the topic",
                 lambda: scrape(again_port, "prefixlog_lmcache_bridge_records_total", outcome="read") >= read)
        wait_for("its records applied as duplicates",
                 lambda: metric(replica.metrics(), "prefixlog_records_skipped_total", reason="duplicate") > 0)
        replica_metrics = replica.metrics()
        assert metric(replica_metrics, "prefixlog_records_skipped_total", reason="stale_epoch") == 0
        assert metric(replica_metrics, "prefixlog_records_skipped_total") == metric(
            replica_metrics, "prefixlog_records_skipped_total", reason="duplicate")
        assert {name: depths(client, t) for name, t in (("p", p), ("q", q), ("r", r))} == answers
        assert not any(s.gapped for t in (p, q, r) for s in client.match(KEYSPACE, tokens=t).scores)

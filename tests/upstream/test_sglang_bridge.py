"""SGLang's own code (0.5.23 wheel: `RadixCache`, its `KVCacheEventRecorder`, `KvEventLoraNames`,
the `EventPublisherFactory` / `ZmqEventPublisher` of a `--kv-events-config`) feeding
`prefixlog bridge`: every answer prefixlog gives over gRPC equals what SGLang's tree itself would
hit (`Engine.hit_depth`), never more.

Cases, page size 16 (and 1): plain prompts with shared prefixes (node splits: SGLang publishes
no event for a split, the next store names a page in the middle of an earlier run as its
parent), a prompt not ending on a page boundary, LoRA (`lora_name`), `cache_salt` (salted runs
split too), LoRA and salt together, `session_id`, the "default" and "dynamo" event formats, the
host and disk tiers (`CPU_PINNED`, `DISK`) with evictions on each, LRU eviction
(`BlockRemoved`), `flush_cache` (`AllBlocksCleared`), two attention-DP ranks of one worker
(the batch's `attn_dp_rank` is the feed's dp rank), EAGLE's bigram pages (asked with lookahead
1), a bridge joining running engines (replay),
a lost message recovered by replay, an engine restart, a flood with one message in 50 lost, an
engine without a replay socket (never an overcount), and the known limitation: a non-LoRA `extra_key` is not in the events (docs/compat/sglang-engine.md).
"""

from __future__ import annotations

import random
import re

import pytest

from conftest import Bridge, Replica, free_port, metric, wait_for
from prefixlog_client import IndexClient
from sglang_engine import VERSION, Engine, LoRA, Request, StorageMedium

BS = 16
MODEL = "sglang-upstream"
CPU, DISK = StorageMedium.CPU, StorageMedium.DISK


def toks(base: int, n: int) -> list:
    return list(range(base, base + n))


def answer(client: IndexClient, ks, worker: int, query: dict, tiers=(), dp_rank: int = 0) -> int:
    """prefixlog's depth for (`worker`, `dp_rank`) (0 if it is not among the holders); never
    gapped. `query` holds the match arguments (tokens, namespace, cache_salt, lookahead)."""
    r = client.match(ks, tiers=tiers, deadline=5.0, **query)
    assert r.outcome in ("scores", "empty"), r
    for s in r.scores:
        if (s.worker, s.dp_rank) == (worker, dp_rank):
            assert not s.gapped, f"worker {worker} gapped: {s}"
            return s.depth
    return 0


def engine_spec(worker: int, e: Engine) -> str:
    replay = f",replay=tcp://127.0.0.1:{e.replay_port}" if e.replay_port else ""
    return f"endpoint=tcp://127.0.0.1:{e.port}{replay},worker={worker}"


def until_subscribed(bridge: Bridge, engines: dict, bs: int):
    """Publishes a real request on every engine until the bridge has received a message from
    each (ZeroMQ drops what a PUB sends before its subscriber is connected; those earlier
    messages are a gap the bridge fills from the replay socket)."""
    filler = iter(range(10**6))

    def all_seen():
        text = bridge.metrics()
        unseen = [e for k, e in engines.items()
                  if metric(text, "prefixlog_bridge_messages_received_total", endpoint=f"tcp://127.0.0.1:{e.port}") == 0]
        for e in unseen:
            e.run(Request(toks(900_000 + 1000 * next(filler), bs + 1)))  # a page, EAGLE too
        return not unseen

    wait_for("the bridge to receive from every engine", all_seen, 60, 0.3)


def expect_equal(client, ks, checks, what: str):
    """Waits until every (worker, dp rank, query, tiers, engine depth) check is answered with
    exactly the engine's depth (the bridge and the replica catch up), then asserts it."""

    def mismatches():
        out = []
        for worker, dp, query, tiers, want in checks:
            got = answer(client, ks, worker, query, tiers, dp)
            if got != want:
                out.append((worker, dp, query.get("namespace"), query.get("cache_salt"), tiers, got, want))
        return out

    last = []

    def equal():
        nonlocal last
        last = mismatches()
        return not last

    try:
        wait_for(what, equal, 60, 0.3)
    except pytest.fail.Exception:
        raise AssertionError(f"{what}: (worker, dp, namespace, salt, tiers, prefixlog, SGLang) {last}")


def refused(text: str) -> dict:
    """Refusals by (worker, reason), from the bridge's metrics."""
    out = {}
    for line in text.splitlines():
        m = re.match(r'prefixlog_bridge_events_refused_total\{([^}]*)\}\s+(\S+)', line)
        if m and float(m.group(2)) > 0:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels.get("worker"), labels.get("reason"))] = float(m.group(2))
    return out


SQL, CHAT = LoRA("sql-adapter"), LoRA("chat-adapter")


def namespace_cases(e: Engine, worker: int) -> list:
    """Runs prompts under adapters and salts on `e` and returns the checks they make: each
    matches only in its own namespace (LoRA name + salt), as SGLang's tree keys it."""
    runs = [
        Request(toks(2000, 48), lora=SQL),
        Request(toks(2000, 32) + toks(2500, 16), lora=SQL),  # splits the adapter's run
        Request(toks(1000, 64), lora=CHAT),  # plain prompt's tokens, another namespace
        Request(toks(3000, 48), cache_salt="tenant-42"),
        Request(toks(3000, 32) + toks(3500, 32), cache_salt="tenant-42"),  # a salted split
        Request(toks(3000, 48), lora=SQL, cache_salt="tenant-42"),
        Request(toks(4000, 48), session_id="session-1"),
    ]
    for r in runs:
        e.run(r)
    asks = runs + [
        Request(toks(2000, 48)),
        Request(toks(2000, 48), lora=CHAT),
        Request(toks(1000, 64), lora=SQL),
        Request(toks(3000, 48)),
        Request(toks(3000, 48), cache_salt="tenant-7"),
        Request(toks(3000, 64), cache_salt="tenant-42"),
        Request(toks(3000, 48), lora=SQL),
        Request(toks(3000, 48), lora=CHAT, cache_salt="tenant-42"),
    ]
    return [(worker, 0, r.query(), (), e.hit_depth(r)) for r in asks]


def test_sglang_cases_answer_what_the_engine_hits(processes):
    replica = Replica()
    processes.append(replica)
    ks = (MODEL, BS, 1)
    e1 = Engine(free_port(), free_port(), BS, capacity=64 * BS)
    e2 = Engine(free_port(), free_port(), BS, format="dynamo", adapters=(SQL, CHAT))
    e3 = Engine(free_port(), free_port(), BS, tiers={CPU: 64 * BS, DISK: 128 * BS})
    e4 = Engine(free_port(), free_port(), BS)
    r0 = Engine(free_port(), free_port(), BS, dp_rank=0)
    r1 = Engine(free_port(), free_port(), BS, dp_rank=1)
    eagle = Engine(free_port(), free_port(), BS, eagle=True)
    engines = {1: e1, 2: e2, 3: e3, 4: e4, 60: r0, 61: r1, 7: eagle}
    specs = {1: e1, 2: e2, 3: e3, 4: e4, 6: r0, 7: eagle}
    try:
        # A bridge joining running engines: what they published before is replayed.
        plain = Request(toks(1000, 64))
        e1.run(plain)
        e4.run(Request(toks(8000, 32)))
        r1.run(Request(toks(9000, 48)))
        bridge = Bridge(replica, MODEL, BS, [engine_spec(w, e) for w, e in specs.items()] + [engine_spec(6, r1)],
                        extra=["--idle-reconnect", "2s", "--replay-timeout", "10s"])
        processes.append(bridge)
        until_subscribed(bridge, engines, BS)

        # Shared prefixes: SGLang splits plain's node at 32 tokens and stores the new branch
        # under page 1 of plain's run; a prompt's partial last page is not cached.
        shared = Request(toks(1000, 32) + toks(1500, 32))
        partial = Request(toks(1000, 64) + toks(1600, 40))
        # A message lost on the wire (the first LoRA prompt's batch), recovered from the replay socket.
        lost = e1.flush() + 2
        e1.drop = lambda seq: seq == lost
        e1.run(shared)
        e1.run(partial)
        checks = namespace_cases(e1, 1)
        e1.flush()
        e1.drop = lambda seq: False

        # The dynamo format: hashes namespaced by extra key and salt, adapters loaded at start.
        e2.run(plain)
        checks += namespace_cases(e2, 2)

        # Tiers: the GPU tree, the host tier's longer run and a branch, the disk tier's; then an
        # eviction on each (the host keeps what the GPU dropped).
        e3.run(Request(toks(6000, 48)))
        e3.run(Request(toks(6000, 64)), CPU)
        e3.run(Request(toks(6000, 32) + toks(6600, 32)), CPU)
        e3.run(Request(toks(6000, 80)), DISK)
        tiers_before = [e3.hit_depth(Request(toks(6000, 80)), m) for m in (StorageMedium.GPU, CPU, DISK)]
        e3.evict(64 * BS)  # everything on the GPU
        e3.evict(BS, CPU)  # the host's least recently used leaf: pages 2-3 of the first run
        e3.evict(BS, DISK)  # the disk's one node, all 5 pages

        # Two attention-DP ranks of one worker: one feed each.
        r0.run(Request(toks(9000, 32)))

        # EAGLE: bigram pages, each covering the token after it (asked with lookahead 1).
        for r in (Request(toks(10_000, 49)), Request(toks(10_000, 33) + toks(10_500, 16)),
                  Request(toks(10_000, 49), lora=SQL)):
            eagle.run(r)

        client = IndexClient([replica.grpc], deadline=5.0)
        diverged = Request(toks(1000, 40) + toks(99_000, 24))
        checks += [
            (1, 0, plain.query(), (), e1.hit_depth(plain)),
            (1, 0, shared.query(), (), e1.hit_depth(shared)),
            (1, 0, partial.query(), (), e1.hit_depth(partial)),
            (1, 0, diverged.query(), (), e1.hit_depth(diverged)),
            (2, 0, plain.query(), (), e2.hit_depth(plain)),
        ]
        for medium, tier in ((StorageMedium.GPU, "gpu"), (CPU, "host"), (DISK, "disk")):
            for r in (Request(toks(6000, 80)), Request(toks(6000, 32) + toks(6600, 32))):
                checks.append((3, 0, r.query(), (tier,), e3.hit_depth(r, medium)))
        for dp, e in ((0, r0), (1, r1)):
            r = Request(toks(9000, 48))
            checks.append((6, dp, r.query(), (), e.hit_depth(r)))
        for r in (Request(toks(10_000, 49)), Request(toks(10_000, 33) + toks(10_500, 16)), Request(toks(10_000, 48)),
                  Request(toks(10_000, 32) + [5] * 17), Request(toks(10_000, 49), lora=SQL)):
            checks.append((7, 0, dict(r.query(), lookahead=1), (), eagle.hit_depth(r)))
        checks.append((7, 0, dict(tokens=toks(10_000, 49)), (), 0))  # asked without the lookahead
        want = [c[4] for c in checks]
        assert want[:15] == [3, 3, 4, 3, 4, 3, 3, 0, 0, 0, 0, 0, 3, 0, 0], f"SGLang's own view (default): {want[:15]}"
        assert want[15:30] == want[:15], "the dynamo format hits the same"
        assert want[30:] == [4, 4, 6, 2, 4, 0, 0, 2, 4, 0, 0, 2, 3, 3, 3, 2, 1, 3, 0], f"SGLang's own view: {want[30:]}"
        assert tiers_before == [3, 4, 5]
        expect_equal(client, ks, checks, f"SGLang {VERSION} cases")

        # LRU eviction: enough new prompts to evict more than the fillers (BlockRemoved).
        olds = [plain, shared, partial, Request(toks(2000, 48), lora=SQL), Request(toks(3000, 48), cache_salt="tenant-42")]
        before = [e1.hit_depth(r) for r in olds]
        for i in range(10):
            e1.run(Request(toks(20_000 + 1000 * i, 64)))
        after = [(1, 0, r.query(), (), e1.hit_depth(r)) for r in olds]
        assert sum(c[4] for c in after) < sum(before), f"some pages were evicted: {before} -> {after}"
        recent = Request(toks(29_000, 64))
        expect_equal(client, ks, after + [(1, 0, recent.query(), (), e1.hit_depth(recent))], "after eviction")

        # flush_cache: AllBlocksCleared; the next prompt is all the engine holds.
        e1.clear()
        e1.run(Request(toks(30_000, 32)))
        cleared = [recent, Request(toks(30_000, 32))]
        expect_equal(client, ks, [(1, 0, r.query(), (), e1.hit_depth(r)) for r in cleared], "after flush_cache")
        assert [e1.hit_depth(r) for r in cleared] == [0, 2]

        # An engine restart: the new process holds nothing of the old one's pages.
        e4.run(Request(toks(8100, 32)))
        e4.restart()
        e4.run(Request(toks(8500, 32)))
        filler = iter(range(100))

        def restart_seen():
            if metric(bridge.metrics(), "prefixlog_bridge_epochs_total", worker=4) >= 1:
                return True
            e4.run(Request(toks(8700 + 100 * next(filler), 16)))
            return False

        wait_for("the bridge to see engine 4's restart", restart_seen, 60, 0.5)
        restarted = [Request(toks(8000, 32)), Request(toks(8100, 32)), Request(toks(8500, 32))]
        assert [e4.hit_depth(r) for r in restarted] == [0, 0, 2]
        expect_equal(client, ks, [(4, 0, r.query(), (), e4.hit_depth(r)) for r in restarted], "after an engine restart")

        text = bridge.metrics()
        gaps = metric(text, "prefixlog_bridge_gaps_total", worker=1)
        assert gaps >= 2, "the late join and the lost message"
        assert metric(text, "prefixlog_bridge_replays_total", worker=1, outcome="ok") >= gaps
        assert metric(text, "prefixlog_bridge_resets_total", worker=1) == 0, "every gap of engine 1 replayed"
        assert metric(text, "prefixlog_bridge_epochs_total", worker=4) == 1
        assert refused(text) == {}, "every event SGLang sent here is exactly indexable"
    finally:
        for e in engines.values():
            e.stop()


def test_sglang_page_size_1(processes):
    """SGLang's default page size: one block per token, nodes split anywhere."""
    replica = Replica()
    processes.append(replica)
    ks = ("sglang-page1", 1, 1)
    e = Engine(free_port(), free_port(), 1, capacity=400)
    try:
        bridge = Bridge(replica, ks[0], 1, [engine_spec(8, e)], extra=["--replay-timeout", "10s"])
        processes.append(bridge)
        until_subscribed(bridge, {8: e}, 1)
        prompts = [
            Request(toks(1000, 50)),
            Request(toks(1000, 17) + toks(1100, 9)),  # a split at token 17
            Request(toks(1000, 5) + [7]),  # and at 5
            Request(toks(1000, 50), lora=SQL),
            Request(toks(1000, 23), cache_salt="tenant-42"),
            Request(toks(1000, 11) + toks(1200, 4), cache_salt="tenant-42"),
        ]
        for r in prompts:
            e.run(r)
        client = IndexClient([replica.grpc], deadline=5.0)
        asks = prompts + [Request(toks(1000, 60)), Request(toks(1000, 50), lora=CHAT), Request(toks(1000, 23))]
        checks = [(8, 0, r.query(), (), e.hit_depth(r)) for r in asks]
        assert [c[4] for c in checks] == [50, 26, 6, 50, 23, 15, 50, 0, 23]
        expect_equal(client, ks, checks, "page size 1")
        for i in range(8):
            e.run(Request(toks(5000 + 100 * i, 60)))
        checks = [(8, 0, r.query(), (), e.hit_depth(r)) for r in asks]
        assert sum(c[4] for c in checks) < 50 + 26 + 6 + 50 + 23 + 15 + 50 + 23, "pages were evicted"
        expect_equal(client, ks, checks, "page size 1 after eviction")
        assert refused(bridge.metrics()) == {}
    finally:
        e.stop()


def recorded(e: Engine) -> list:
    """The batches `e` publishes from now on, as the wire carries them (msgpack, decoded)."""
    import msgspec

    out, publish = [], e.publisher.publish

    def spy(batch):
        publish(batch)  # stamps attn_dp_rank
        out.append(msgspec.msgpack.decode(msgspec.msgpack.encode(batch)))

    e.publisher.publish = spy
    return out


def test_sglang_publishes_what_the_cases_rely_on():
    """What SGLang's own recorder and publisher send for the cases above (no prefixlog process):
    a split sends nothing and the next store names a page inside an earlier run as its parent;
    runs coalesce into one store; LoRA stores carry `lora_name` (default format: registered per
    request; dynamo: also resolved from the adapters loaded) with hashes that differ from the
    plain ones; salted stores carry `cache_salt` on every store; the tiers' media; evictions
    remove whole nodes; EAGLE pages are pairs; the batch is `[ts, events, attn_dp_rank]`."""
    e = Engine(free_port(), None, 4, dp_rank=1, tiers={CPU: 64, DISK: 64})
    d = Engine(free_port(), None, 4, format="dynamo", adapters=(SQL,))
    g = Engine(free_port(), None, 4, eagle=True)
    try:
        got, dyn, eg = recorded(e), recorded(d), recorded(g)
        for x in (e, d):
            x.run(Request(toks(0, 12)))
            x.run(Request(toks(0, 4) + toks(50, 4)))  # splits the first run after page 0
            x.run(Request(toks(0, 12), lora=SQL, cache_salt="t"))
            x.run(Request(toks(0, 12), cache_salt="t"))
        e.run(Request(toks(0, 8)), CPU)
        e.run(Request(toks(0, 8)), DISK)
        e.evict(100)
        g.run(Request(toks(0, 9)))
        for x in (e, d, g):
            x.flush()
        stores = [b[1][0] for b in got[:4]]
        assert [len(b[1]) for b in got[:4]] == [1, 1, 1, 1] and all(b[2] == 1 for b in got), "attn_dp_rank"
        plain, branch, lora, salted = stores
        assert (len(plain["block_hashes"]), plain["parent_block_hash"]) == (3, None), "one coalesced store"
        assert branch["parent_block_hash"] == plain["block_hashes"][0], "the split sent nothing"
        assert (lora["lora_name"], lora["cache_salt"], salted["cache_salt"]) == ("sql-adapter", "t", "t")
        assert "lora_name" not in salted and len({plain["block_hashes"][0], lora["block_hashes"][0],
                                                  salted["block_hashes"][0]}) == 3
        dstores = [b[1][0] for b in dyn]
        assert dstores[2]["lora_name"] == "sql-adapter"
        assert [s["block_hashes"] for s in dstores[:2]] == [plain["block_hashes"], branch["block_hashes"]]
        assert dstores[2]["block_hashes"] != lora["block_hashes"], "dynamo namespaces hashes otherwise"
        assert [b[1][0]["medium"] for b in got[4:6]] == ["CPU_PINNED", "DISK"]
        removed = [ev for ev in got[6][1]]
        assert {ev["type"] for ev in removed} == {"BlockRemoved"}
        assert sorted(h for ev in removed for h in ev["block_hashes"]) == sorted(
            plain["block_hashes"] + branch["block_hashes"] + lora["block_hashes"] + salted["block_hashes"])
        assert eg[0][1][0]["token_ids"][:2] == [[0, 1], [1, 2]] and len(eg[0][1][0]["block_hashes"]) == 2
    finally:
        for x in (e, d, g):
            x.stop()


def test_sglang_non_lora_extra_key_is_not_in_the_events(processes):
    """The known limitation (docs/compat/sglang-engine.md): SGLang keys its tree by a request's
    extra_key, but the default format publishes nothing naming a non-LoRA one (and the same
    hashes as a plain prompt), so the bridge indexes such pages as plain ones. Pinned so a
    change on either side is noticed."""
    e = Engine(free_port(), None, BS)
    got = recorded(e)
    e.run(Request(toks(1000, 32), extra_key="retrieval-v2"))
    e.run(Request(toks(1000, 32)))
    e.flush()
    e.stop()
    (keyed,), (plain,) = got[0][1], got[1][1]
    assert keyed == plain, "a non-LoRA extra_key changes nothing SGLang publishes"
    assert e.hit_depth(Request(toks(1000, 32), extra_key="retrieval-v2")) == 2

    replica = Replica()
    processes.append(replica)
    e = Engine(free_port(), free_port(), BS)
    try:
        bridge = Bridge(replica, MODEL, BS, [engine_spec(9, e)], extra=["--replay-timeout", "10s"])
        processes.append(bridge)
        until_subscribed(bridge, {9: e}, BS)
        e.run(Request(toks(1000, 32), extra_key="retrieval-v2"))
        assert e.hit_depth(Request(toks(1000, 32))) == 0
        client = IndexClient([replica.grpc], deadline=5.0)
        # SGLang would hit 0 pages for the plain prompt; prefixlog credits 2 (documented).
        expect_equal(client, (MODEL, BS, 1), [(9, 0, dict(tokens=toks(1000, 32)), (), 2)], "the known limitation")
    finally:
        e.stop()


def test_sglang_without_a_replay_socket_never_overcounts(processes):
    """SGLang's default `--kv-events-config` has no replay endpoint. A bridge joining late, and
    a lost message (here an eviction's `BlockRemoved`), then start the worker over (a new epoch:
    its state cleared through the log, never gapped): the evicted pages are not credited, pages
    stored under parents from before the reset are refused (`unknown_parent`), an undercount;
    no answer exceeds what SGLang hits, and prompts stored after the reset are answered exactly."""
    replica = Replica()
    processes.append(replica)
    e = Engine(free_port(), None, BS)
    try:
        old = [Request(toks(1000, 64)), Request(toks(2000, 48), cache_salt="tenant-42")]
        keep = Request(toks(5000, 32))
        for r in old + [keep]:
            e.run(r)
        bridge = Bridge(replica, MODEL, BS, [engine_spec(10, e)])
        processes.append(bridge)
        until_subscribed(bridge, {10: e}, BS)
        lost = e.flush()
        e.drop = lambda seq: seq == lost
        e.evict(64 + 48)  # the two least recently used leaves: `old`, removed in the lost message
        e.flush()
        e.drop = lambda seq: False
        extended = Request(toks(5000, 32) + toks(5100, 16))
        e.run(extended)
        fresh = [Request(toks(4000, 48)), Request(toks(4000, 16) + toks(4100, 16), lora=SQL)]
        for r in fresh:
            e.run(r)
        client = IndexClient([replica.grpc], deadline=5.0)
        ks = (MODEL, BS, 1)
        assert [e.hit_depth(r) for r in old + [keep, extended]] == [0, 0, 2, 3]
        expect_equal(client, ks, [(10, 0, r.query(), (), e.hit_depth(r)) for r in fresh + old], "after the reset")
        for r in (keep, extended):
            got, want = answer(client, ks, 10, r.query()), e.hit_depth(r)
            assert got <= want, f"overcount: prefixlog {got}, SGLang {want} for {r.tokens[:2]}..."
        text = bridge.metrics()
        assert metric(text, "prefixlog_bridge_resets_total", worker=10) == 2, "the join and the lost message"
        assert refused(text) == {("10", "unknown_parent"): 1}, "the extended prompt's new page"
    finally:
        e.stop()


def test_sglang_flood_with_drops_recovers_every_gap_by_replay(processes):
    """1,500 scheduler steps of prompts sharing prefixes (splits and LRU evictions), one published
    message in 50 lost: every gap is filled by one replay, nothing is reset, and every answer
    equals SGLang's own."""
    replica = Replica()
    processes.append(replica)
    e = Engine(free_port(), free_port(), BS, capacity=256 * BS)
    try:
        bridge = Bridge(replica, MODEL, BS, [engine_spec(5, e)], extra=["--replay-timeout", "10s"])
        processes.append(bridge)
        until_subscribed(bridge, {5: e}, BS)
        first = e.flush()
        # The join's gap (the engine published its AllBlocksCleared before the bridge came).
        joined = metric(bridge.metrics(), "prefixlog_bridge_gaps_total", worker=5)
        e.drop = lambda seq: seq % 50 == 25
        rng = random.Random(46)
        heads = [toks(100_000 + 10_000 * i, 48) for i in range(12)]
        prompts = []
        for step in range(1500):
            head = rng.choice(heads)[: BS * rng.randint(1, 3) - rng.randint(0, 8)]
            salt = "tenant-1" if step % 7 == 0 else None
            r = Request(head + toks(500_000 + 100 * step, BS * rng.randint(0, 2) + rng.randint(0, 5)), cache_salt=salt)
            e.run(r)
            prompts.append(r)
        end = e.flush()
        e.drop = lambda seq: False
        dropped = sum(1 for seq in range(first, end) if seq % 50 == 25)
        e.run(Request(toks(999_000, BS)))  # a last message, so the bridge sees any final gap
        client = IndexClient([replica.grpc], deadline=5.0)
        sample = rng.sample(prompts, 150) + [Request(h) for h in heads]
        checks = [(5, 0, r.query(), (), e.hit_depth(r)) for r in sample]
        assert sum(c[4] for c in checks) > 100, "the sample hits the engine's cache"
        expect_equal(client, (MODEL, BS, 1), checks, "after the flood")
        text = bridge.metrics()
        gaps = metric(text, "prefixlog_bridge_gaps_total", worker=5)
        assert dropped >= 20 and gaps - joined == dropped, f"{dropped} messages lost, {gaps} gaps ({joined} at the join)"
        assert metric(text, "prefixlog_bridge_replays_total", worker=5, outcome="ok") == gaps, "one replay per gap"
        assert metric(text, "prefixlog_bridge_resets_total", worker=5) == 0, "never reset, never gapped"
        assert refused(text) == {}
    finally:
        e.stop()

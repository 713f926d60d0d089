"""vLLM's own code (0.34.0 wheel: `BlockPool`, its block hashing, `ZmqEventPublisher`) feeding
`prefixlog bridge`: every answer prefixlog gives over gRPC equals what the engine itself would hit
(`Engine.hit_depth`, from the engine's own hashes and cache), never more.

Cases: plain prompts with shared prefixes and LRU eviction (real BlockRemoved events), LoRA,
cache salts, a multimodal input at two offsets, hash lookahead, a CPU offload tier, a remote
store (`locality=REMOTE`), a bridge joining a running engine, a lost message recovered by replay,
an engine restart, and a flood with one message in 50 lost.
"""

from __future__ import annotations

import random

import pytest

from conftest import Bridge, Replica, free_port, metric, wait_for
from prefixlog_client import IndexClient
from vllm_engine import VERSION, Engine, LoRA, Request

BS = 16
MODEL = "vllm-upstream"


def toks(base: int, n: int) -> list:
    return list(range(base, base + n))


def answer(client: IndexClient, worker: int, query: dict, tiers=(), lookahead=0) -> int:
    """prefixlog's depth for `worker` (0 if it is not among the holders); never gapped."""
    r = client.match((MODEL, BS, 1), tiers=tiers, lookahead=lookahead, deadline=5.0, **query)
    assert r.outcome in ("scores", "empty"), r
    for s in r.scores:
        if s.worker == worker:
            assert not s.gapped, f"worker {worker} gapped: {s}"
            return s.depth
    return 0


def engine_spec(worker: int, e: Engine) -> str:
    replay = f",replay=tcp://127.0.0.1:{e.replay_port}" if e.replay_port else ""
    return f"endpoint=tcp://127.0.0.1:{e.port}{replay},worker={worker}"


def until_subscribed(bridge: Bridge, engines: dict):
    """Publishes a real request on every engine until the bridge has received a message from
    each (ZeroMQ drops what a PUB sends before its subscriber is connected; those earlier
    messages are a gap the bridge fills from the replay socket)."""
    filler = iter(range(10**6))

    def all_seen():
        text = bridge.metrics()
        unseen = [e for w, e in engines.items() if metric(text, "prefixlog_bridge_messages_received_total", worker=w) == 0]
        for e in unseen:
            e.run(Request(toks(900_000 + 1000 * next(filler), BS + e.lookahead)))
        return not unseen

    wait_for("the bridge to receive from every engine", all_seen, 60, 0.3)


def expect_equal(client, checks, what: str):
    """Waits until every (worker, query, tiers, lookahead, engine depth) check is answered with
    exactly the engine's depth (the bridge and the replica catch up), then asserts it."""

    def mismatches():
        out = []
        for worker, query, tiers, lookahead, want in checks:
            got = answer(client, worker, query, tiers, lookahead)
            if got != want:
                out.append((worker, query.get("namespace"), query.get("cache_salt"), tiers, lookahead, got, want))
        return out

    last = []

    def equal():
        nonlocal last
        last = mismatches()
        return not last

    try:
        wait_for(what, equal, 60, 0.3)
    except pytest.fail.Exception:
        raise AssertionError(f"{what}: (worker, namespace, salt, tiers, lookahead, prefixlog, vLLM) {last}")


def test_vllm_cases_answer_what_the_engine_hits(processes):
    replica = Replica()
    processes.append(replica)
    e1 = Engine(free_port(), free_port(), BS, blocks=40)
    e2 = Engine(free_port(), free_port(), BS, lookahead=1)
    e3 = Engine(free_port(), free_port(), BS, cpu_blocks=32)
    e4 = Engine(free_port(), free_port(), BS)
    engines = {1: e1, 2: e2, 3: e3, 4: e4}
    try:
        # A bridge joining running engines: what they published before is replayed.
        plain = Request(toks(1000, 64))
        e1.run(plain)
        e4.run(Request(toks(8000, 32)))
        bridge = Bridge(replica, MODEL, BS, [engine_spec(w, e) for w, e in engines.items()],
                        extra=["--idle-reconnect", "2s", "--replay-timeout", "10s"])
        processes.append(bridge)
        until_subscribed(bridge, engines)

        # Shared prefixes: a second prompt reuses plain's first two cached blocks (a store under
        # an existing parent).
        shared = Request(toks(1000, 32) + toks(1500, 32))
        lora = Request(toks(2000, 48), lora=LoRA("sql-adapter", 7))
        salted = Request(toks(3000, 48), cache_salt="tenant-42")
        image = Request(toks(4000, 64), mm=[("img-A", 20, 8)])
        # A message lost on the wire, recovered from the replay socket.
        lost = e1.flush() + 1  # lora's batch
        e1.drop = lambda seq: seq == lost
        for r in (shared, lora, salted, image):
            e1.run(r)
        e1.flush()
        e1.drop = lambda seq: False

        look = Request(toks(5000, 49))  # 3 blocks, each hashed with the next token
        e2.run(look)

        e3.run(Request(toks(6000, 48)))  # GPU: 3 blocks
        e3.run(Request(toks(6000, 64)), medium="CPU")  # host tier: 4 blocks

        def remote(events):
            for ev in events:
                ev.locality, ev.medium = "REMOTE", kv_events_storage()

        e3.run(Request(toks(7000, 32)), medium="CPU", mutate=remote)

        client = IndexClient([replica.grpc], deadline=5.0)
        diverged = toks(1000, 40) + toks(99_000, 24)  # plain's first 2 blocks, then another 8 tokens
        checks = [
            (1, plain.query(), (), 0, e1.hit_depth(plain)),
            (1, dict(tokens=diverged), (), 0, e1.hit_depth(Request(diverged))),
            (1, shared.query(), (), 0, e1.hit_depth(shared)),
            # LoRA: only under its own adapter.
            (1, lora.query(), (), 0, e1.hit_depth(lora)),
            (1, dict(tokens=lora.tokens), (), 0, e1.hit_depth(Request(lora.tokens))),
            (1, dict(lora.query(), namespace="other"), (), 0, e1.hit_depth(Request(lora.tokens, LoRA("other", 8)))),
            # Cache salt: only under the same salt.
            (1, salted.query(), (), 0, e1.hit_depth(salted)),
            (1, dict(tokens=salted.tokens), (), 0, e1.hit_depth(Request(salted.tokens))),
            (1, dict(salted.query(), cache_salt="tenant-7"), (), 0, e1.hit_depth(Request(salted.tokens, cache_salt="tenant-7"))),
            # The same image two tokens earlier is another block 1, as vLLM hashes it.
            (1, image.query(), (), 0, e1.hit_depth(image)),
            (1, dict(image.query(), mm_inputs=[("img-A", 18, 8)]), (), 0, e1.hit_depth(Request(image.tokens, mm=[("img-A", 18, 8)]))),
            (1, dict(tokens=image.tokens), (), 0, e1.hit_depth(Request(image.tokens))),
            # Lookahead: the engine's blocks match only a query asking with the same lookahead;
            # a prompt diverging at block 2's first token loses block 1 too.
            (2, dict(tokens=look.tokens), (), 1, e2.hit_depth(look)),
            (2, dict(tokens=look.tokens[:32] + [7] + look.tokens[33:]), (), 1,
             e2.hit_depth(Request(look.tokens[:32] + [7] + look.tokens[33:]))),
            (2, dict(tokens=look.tokens), (), 0, 0),
            # Tiers: the GPU chain and the host tier's longer one; a remote store is not held.
            (3, dict(tokens=toks(6000, 64)), ("gpu",), 0, e3.hit_depth(Request(toks(6000, 64)))),
            (3, dict(tokens=toks(6000, 64)), ("host",), 0, e3.hit_depth(Request(toks(6000, 64)), "CPU")),
            (3, dict(tokens=toks(7000, 32)), (), 0, 0),
        ]
        assert [c[4] for c in checks] == [4, 2, 4, 3, 0, 0, 3, 0, 0, 4, 1, 1, 3, 1, 0, 3, 4, 0], "the engine's own view"
        expect_equal(client, checks, f"vLLM {VERSION} cases")

        # LRU eviction: enough new prompts to evict the oldest cached blocks (BlockRemoved).
        for i in range(6):
            e1.run(Request(toks(20_000 + 1000 * i, 64)))
        evicted = [plain, shared, lora, salted, image]
        checks = [(1, r.query(), (), 0, e1.hit_depth(r)) for r in evicted]
        assert sum(c[4] for c in checks) < sum([4, 4, 3, 3, 4]), "some blocks were evicted"
        expect_equal(client, checks, "after eviction")

        # An engine restart: the new process holds nothing of the old one's blocks.
        e4.run(Request(toks(8100, 32)))
        e4.restart()
        e4.run(Request(toks(8500, 32)))
        e4.run(Request(toks(8600, 32)))
        # The bridge finds the new publisher when it re-subscribes (a silent SUB socket is
        # re-established after --idle-reconnect); the engine keeps publishing meanwhile.
        filler = iter(range(100))

        def restart_seen():
            if metric(bridge.metrics(), "prefixlog_bridge_epochs_total", worker=4) >= 1:
                return True
            e4.run(Request(toks(8700 + 100 * next(filler), 16)))
            return False

        wait_for("the bridge to see engine 4's restart", restart_seen, 60, 0.5)
        checks = [
            (4, dict(tokens=toks(8000, 32)), (), 0, 0),
            (4, dict(tokens=toks(8100, 32)), (), 0, 0),
            (4, dict(tokens=toks(8500, 32)), (), 0, 2),
            (4, dict(tokens=toks(8600, 32)), (), 0, 2),
        ]
        expect_equal(client, checks, "after an engine restart")

        text = bridge.metrics()
        gaps = metric(text, "prefixlog_bridge_gaps_total", worker=1)
        w1 = "\n".join(l for l in text.splitlines() if 'worker="1"' in l and not l.startswith("prefixlog_bridge_publish_latency"))
        assert gaps >= 2, f"the late join and the lost message:\n{w1}"
        assert metric(text, "prefixlog_bridge_replays_total", worker=1, outcome="ok") >= gaps
        assert metric(text, "prefixlog_bridge_resets_total", worker=1) == 0, "every gap of engine 1 replayed"
        assert metric(text, "prefixlog_bridge_events_refused_total", worker=3, reason="residency") == 1
        assert metric(text, "prefixlog_bridge_epochs_total", worker=4) == 1
    finally:
        for e in engines.values():
            e.stop()


def kv_events_storage() -> str:
    from vllm_engine import kv_events

    return kv_events.MEDIUM_STORAGE


def test_vllm_flood_with_drops_recovers_every_gap_by_replay(processes):
    """1,500 steps of prompts sharing prefixes, one published message in 50 lost: every gap is
    filled by one replay, nothing is reset, and every answer equals the engine's own."""
    replica = Replica()
    processes.append(replica)
    e = Engine(free_port(), free_port(), BS, blocks=256)
    try:
        bridge = Bridge(replica, MODEL, BS, [engine_spec(5, e)], extra=["--replay-timeout", "10s"])
        processes.append(bridge)
        until_subscribed(bridge, {5: e})
        first = e.flush()
        # Counted from here: a late join (the bridge's first message after some it never saw)
        # is a gap of its own, before the flood, when subscribing took more than one message.
        def gaps_and_replays():
            text = bridge.metrics()
            return (metric(text, "prefixlog_bridge_gaps_total", worker=5),
                    metric(text, "prefixlog_bridge_replays_total", worker=5, outcome="ok"))

        wait_for("the late join's replay", lambda: len(set(gaps_and_replays())) == 1, 30, 0.2)
        gaps0, replays0 = gaps_and_replays()
        e.drop = lambda seq: seq % 50 == 25
        rng = random.Random(46)
        heads = [toks(100_000 + 10_000 * i, 48) for i in range(12)]
        prompts = []
        for step in range(1500):
            head = rng.choice(heads)[: BS * rng.randint(1, 3)]
            r = Request(head + toks(500_000 + 100 * step, BS * rng.randint(0, 2)))
            e.run(r)
            prompts.append(r)
        end = e.flush()
        e.drop = lambda seq: False
        dropped = sum(1 for seq in range(first, end) if seq % 50 == 25)
        e.run(Request(toks(999_000, BS)))  # a last message, so the bridge sees any final gap
        client = IndexClient([replica.grpc], deadline=5.0)
        sample = rng.sample(prompts, 150) + [Request(h) for h in heads]
        checks = [(5, r.query(), (), 0, e.hit_depth(r)) for r in sample]
        assert sum(c[4] for c in checks) > 100, "the sample hits the engine's cache"
        expect_equal(client, checks, "after the flood")
        text = bridge.metrics()
        gaps = metric(text, "prefixlog_bridge_gaps_total", worker=5) - gaps0
        assert dropped >= 20 and gaps == dropped, f"{dropped} messages lost, {gaps} gaps (and {gaps0} before the flood)"
        replays = metric(text, "prefixlog_bridge_replays_total", worker=5, outcome="ok") - replays0
        assert replays == gaps, "one replay per gap"
        assert metric(text, "prefixlog_bridge_resets_total", worker=5) == 0, "never reset, never gapped"
    finally:
        e.stop()


def test_vllm_lost_tail_is_recovered_without_a_next_message(processes):
    """The engine's last message is lost and it publishes nothing after it: the bridge finds it
    once the stream has been quiet for `--tail-probe` (default 2 s), by replay. The lost message
    clears the cache, so without the probe the worker would keep being credited (an overcount)
    until the engine's next step."""
    replica = Replica()
    processes.append(replica)
    e = Engine(free_port(), free_port(), BS)
    try:
        bridge = Bridge(replica, MODEL, BS, [engine_spec(6, e)], extra=["--replay-timeout", "10s"])
        processes.append(bridge)
        until_subscribed(bridge, {6: e})
        r = Request(toks(700_000, 48))
        e.run(r)
        client = IndexClient([replica.grpc], deadline=5.0)
        expect_equal(client, [(6, r.query(), (), 0, 3)], "the stored prompt")
        last = e.flush()
        e.drop = lambda seq: seq == last
        e.clear()  # the tail: nothing follows it
        assert e.flush() == last + 1
        e.drop = lambda seq: False
        assert e.hit_depth(r) == 0
        expect_equal(client, [(6, r.query(), (), 0, 0)], "after the lost clear")
        text = bridge.metrics()
        assert metric(text, "prefixlog_bridge_tails_recovered_total", worker=6) >= 1, text
        assert metric(text, "prefixlog_bridge_resets_total", worker=6) == 0, "recovered, not reset"
    finally:
        e.stop()

"""Dynamo's HTTP indexer API, differentially: the same requests, in the same order, to the real
`python -m dynamo.indexer` (ai-dynamo-runtime, pins.txt) and to prefixlog's facade (`prefixlog
serve --http-indexer-addr`), both fed the same KV events by vLLM's own ZeroMQ publisher, compared
status for status, content type for content type and body for body.

Registrations go to both (`/register`: each subscribes to the engines itself); one more engine
feeds prefixlog through `prefixlog bridge --hash-scheme 2` while the real indexer registers it.
Queries, bad input, `/workers`, `/unregister`, `/dump`, the peer routes and body sizes follow.
A difference is a bug unless it is one of the deliberate differences listed in
docs/compat/dynamo-mooncake-http.md, each pinned by `test_pinned_differences`.

The real indexer runs with `--threads 1`: with its default of 4 threads, 1.6.1's concurrent radix
tree refuses a store whose blocks continue a prefix another worker created ("Stale parent hash
could not be resolved"), which depends on which listener thread applies first.

ZeroMQ drops what a publisher sends before a subscriber has connected, so every engine stream is
first attached: a probe is published until both sides have received it, then an all-cleared
event resets both (it also ends the sequence gap prefixlog's subscription reported for the
probes it missed), and a marker store proves both index the stream from there on.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import upstream_loader as ul
from conftest import Bridge, Replica, free_port, metric, wait_for

MODEL, BS = "m", 4
# The prompt every step asks about: six blocks, block i's engine hash 1000 + i (the same on
# every worker, as one vLLM build hashes one prefix).
T = list(range(1, 25))
H = [1000 + i for i in range(6)]


def vllm_events():
    ul.package("vllm", real=["vllm.distributed.kv_events", "vllm.v1.core.kv_cache_utils",
                             "vllm.utils.hashing", "vllm.envs", "vllm.multimodal.utils"])
    return importlib.import_module("vllm.distributed.kv_events")


def dynamo_hashes(tokens, lora=None, signed=True):
    """Dynamo's own block hashes of `tokens` (its Python binding): as `/query_by_hash` takes
    them, i64 (the same 64 bits), or as `/dump` names them (`signed=False`, u64)."""
    from dynamo.llm import compute_block_hash_for_seq

    hashes = compute_block_hash_for_seq(tokens, BS, lora_name=lora)
    return [h - (1 << 64) if signed and h >= 1 << 63 else h for h in hashes]


class Side:
    """One indexer's HTTP port."""

    def __init__(self, name: str, port: int):
        self.name, self.base = name, f"http://127.0.0.1:{port}"

    def call(self, method: str, path: str, body=None, *, raw: bytes | None = None,
             content_type: str | None = "application/json"):
        """(status, content type, body: parsed JSON, else text)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if content_type and data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, ctype, text = r.status, r.headers.get("content-type"), r.read().decode()
        except urllib.error.HTTPError as e:
            status, ctype, text = e.code, e.headers.get("content-type"), e.read().decode()
        try:
            return status, ctype, json.loads(text)
        except ValueError:
            return status, ctype, text

    def query(self, tokens, **extra):
        return self.call("POST", "/query", {"token_ids": tokens, "model_name": MODEL, **extra})


class Upstream:
    """`python -m dynamo.indexer` as a child process (duck-types conftest's Process)."""

    def __init__(self):
        self.port = free_port()
        self.log_path = tempfile.mktemp(prefix="dynamo-indexer-", suffix=".log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dynamo.indexer", "--port", str(self.port), "--threads", "1"],
            stdout=self._log, stderr=subprocess.STDOUT)
        self.side = Side("dynamo", self.port)
        wait_for("dynamo.indexer's /health", lambda: self.side.call("GET", "/health")[0] == 200, 60)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def dump(self):
        print(f"----- dynamo.indexer log -----\n{Path(self.log_path).read_text(errors='replace')}")


@pytest.fixture
def pair(processes):
    """(real indexer, prefixlog replica serving the facade, its Side)."""
    up = Upstream()
    processes.append(up)
    port = free_port()
    replica = Replica(partitions=2, extra=["--http-indexer-addr", f"127.0.0.1:{port}"])
    processes.append(replica)
    ours = Side("prefixlog", port)
    wait_for("the facade", lambda: ours.call("GET", "/health")[0] == 200, 60)
    return up.side, replica, ours


def normalized(path: str, r):
    """Upstream lists workers and peers in hash-map order: compared sorted."""
    status, ctype, body = r
    if isinstance(body, list) and path.startswith("/workers"):
        body = sorted(body, key=lambda w: w["instance_id"])
    if isinstance(body, list) and path == "/peers":
        body = sorted(body)
    return status, ctype, body


def same(real: Side, ours: Side, method, path, body=None, **kw):
    """Sends one request to both and asserts equal answers; returns the answer."""
    a = normalized(path, real.call(method, path, body, **kw))
    b = normalized(path, ours.call(method, path, body, **kw))
    assert a == b, f"{method} {path} {body if kw.get('raw') is None else kw['raw'][:80]!r}\n real: {a}\n ours: {b}"
    return a


def settle(real: Side, ours: Side, requests, witness, what: str):
    """Waits until the real indexer shows `witness(answers)` (the step's events applied there),
    then until prefixlog answers every request the same (bounded); returns the answers."""
    def answers(side):
        return [normalized(r[1], side.call(*r)) for r in requests]

    wait_for(f"dynamo.indexer to apply {what}", lambda: witness(answers(real)), 20)
    last = {}

    def equal():
        last["real"], last["ours"] = answers(real), answers(ours)
        return last["real"] == last["ours"]

    deadline = time.monotonic() + 20
    while not equal():
        assert time.monotonic() < deadline, f"after {what}:\n real: {last['real']}\n ours: {last['ours']}"
        time.sleep(0.05)
    return last["real"]


def scores(answer):
    return answer[2].get("scores") if isinstance(answer[2], dict) else None


class Engine:
    """A vLLM KV-event publisher for one (worker, dp rank)."""

    def __init__(self, ke, worker: int, dp: int, batch_dp: int | None = None):
        self.ke, self.worker, self.dp = ke, worker, dp
        base = free_port()
        rank = dp if batch_dp is None else batch_dp
        # vLLM adds its data-parallel rank to the port it binds.
        self.pub = ke.ZmqEventPublisher(data_parallel_rank=rank, endpoint=f"tcp://*:{base}")
        self.endpoint = f"tcp://127.0.0.1:{base + rank}"

    def send(self, *events):
        self.pub.publish(self.ke.KVEventBatch(ts=time.time(), events=list(events)))

    def stored(self, hashes, parent, tokens, medium="GPU", lora_name=None, extra_keys=None):
        return self.ke.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                                   block_size=BS, lora_id=None, medium=medium, lora_name=lora_name,
                                   extra_keys=extra_keys)

    def removed(self, hashes, medium="GPU"):
        return self.ke.BlockRemoved(block_hashes=hashes, medium=medium)

    def cleared(self):
        return self.ke.AllBlocksCleared()

    def registration(self, model=MODEL, **extra):
        return {"instance_id": self.worker, "endpoint": self.endpoint, "model_name": model,
                "block_size": BS, "dp_rank": self.dp, **extra}


def attach(real: Side, ours: Side, replica: Replica, e: Engine, model=MODEL, real_dp=None):
    """Makes both sides index `e`'s stream from now on (module doc)."""
    probe = [900_000 + 10 * e.worker + e.dp] * BS
    key = {"token_ids": probe, "model_name": model}
    real_dp = e.dp if real_dp is None else real_dp

    def received():
        e.send(e.stored([7_000_000 + e.worker * 10 + e.dp], None, probe))
        s = scores(real.call("POST", "/query", key)) or {}
        seen = str(real_dp) in s.get(str(e.worker), {})
        got = metric(replica.metrics(), "prefixlog_bridge_messages_received_total", endpoint=e.endpoint)
        return seen and got > 0

    wait_for(f"both sides to receive worker {e.worker} dp {e.dp}'s probe", received, 30, interval=0.1)
    e.send(e.cleared())
    marker = [800_000 + 10 * e.worker + e.dp] * BS
    e.send(e.stored([8_000_000 + e.worker * 10 + e.dp], None, marker))
    mark = {"token_ids": marker, "model_name": model}
    for side in (real, ours):
        wait_for(f"{side.name} to index worker {e.worker} dp {e.dp}'s marker and not its probe",
                 lambda: str(e.worker) in (scores(side.call("POST", "/query", mark)) or {})
                 and str(e.worker) not in (scores(side.call("POST", "/query", key)) or {}), 20)
    e.send(e.cleared())
    for side in (real, ours):
        wait_for(f"{side.name} to clear worker {e.worker} dp {e.dp}",
                 lambda: str(e.worker) not in (scores(side.call("POST", "/query", mark)) or {}), 20)


def test_same_requests_same_answers(pair, processes):
    real, replica, ours = pair
    ke = vllm_events()
    w1, w2, w2b, w7 = Engine(ke, 1, 0), Engine(ke, 2, 0), Engine(ke, 2, 1), Engine(ke, 7, 0)
    same(real, ours, "GET", "/health")
    same(real, ours, "POST", "/query", {"token_ids": T, "model_name": MODEL})  # 404: no indexer
    same(real, ours, "GET", "/workers")
    same(real, ours, "GET", "/dump")

    # Registrations, conflicts and bad endpoints.
    for e in (w1, w2, w2b):
        assert same(real, ours, "POST", "/register", e.registration())[0] == 201
    same(real, ours, "POST", "/register", w1.registration())  # 409: rank registered
    same(real, ours, "POST", "/register", {**w1.registration(), "dp_rank": 3, "model_name": "other"})
    same(real, ours, "POST", "/register", {**w7.registration(), "block_size": 16})  # 409: block size
    same(real, ours, "POST", "/register", {**w7.registration(), "endpoint": "nope"})
    same(real, ours, "POST", "/register", {**w7.registration(), "endpoint": "tcp://h"})
    same(real, ours, "POST", "/register", {**w7.registration(), "endpoint": "tcp://h:99999"})
    same(real, ours, "POST", "/register", {**w7.registration(), "replay_endpoint": "udp://h:1"})
    # Registered and never published to: listed, answers nothing.
    assert same(real, ours, "POST", "/register", {**w7.registration(), "tenant_id": "t"})[0] == 201
    for e in (w1, w2, w2b):
        attach(real, ours, replica, e)
    same(real, ours, "GET", "/workers")

    # Events, each step settled on both sides, then the same questions.
    q = lambda **kw: ("POST", "/query", {"token_ids": T, "model_name": MODEL, **kw})  # noqa: E731
    by_hash = ("POST", "/query_by_hash", {"block_hashes": dynamo_hashes(T), "model_name": MODEL})
    questions = [q(), q(lora_name="sql"), q(token_ids=T[:3]), q(routing_group="x"), by_hash,
                 q(model_name="zz")]
    w1.send(w1.stored(H[:3], None, T[:12]))
    w1.send(w1.stored(H[3:4], H[2], T[12:16]))
    w2.send(w2.stored(H[:1], None, T[:4]))
    w2b.send(w2b.stored(H[:2], None, T[:8]))
    a = settle(real, ours, questions, lambda a: scores(a[0]) == {"1": {"0": 16}, "2": {"0": 4, "1": 8}},
               "the first stores")
    assert a[3][0] == 404 and a[5][0] == 404, a
    # A continuation offloaded to host memory, and a LoRA adapter's block.
    w2.send(w2.stored(H[1:3], H[0], T[4:12], medium="CPU"))
    w1.send(w1.stored([4001], None, T[:4], lora_name="sql"))
    a = settle(real, ours, questions, lambda a: a[0][2]["instances"]["2"]["cpu"] == 12 and scores(a[1]),
               "the offload and the LoRA block")
    assert a[0][2]["instances"]["2"] == {"longest_matched": 12, "gpu": 8, "dp": {"0": 4, "1": 8},
                                         "cpu": 12, "disk": 12}, a
    # A removal in the middle of worker 1's chain; worker 2's dp 0 engine clears its cache.
    w1.send(w1.removed([H[2]]))
    w2.send(w2.cleared())
    settle(real, ours, questions, lambda a: scores(a[0]) == {"1": {"0": 8}, "2": {"1": 8}},
           "the removal and the clear")

    # Prompt sizes: 100k tokens is one query; the body limits are upstream's.
    same(real, ours, "POST", "/query", {"token_ids": T + [5] * 100_000, "model_name": MODEL})
    same(real, ours, "POST", "/query_by_hash", {"block_hashes": [1] * 300_000, "model_name": MODEL})
    pad = lambda n: json.dumps({"token_ids": T, "model_name": MODEL, "pad": "x" * n}).encode()  # noqa: E731
    fill = 8 * 1024 * 1024 - len(pad(0))
    for path in ("/query", "/query_by_hash"):
        same(real, ours, "POST", path, raw=pad(fill))
        same(real, ours, "POST", path, raw=pad(fill + 1))
    small = 2 * 1024 * 1024 - len(json.dumps({"url": ""}))
    for n in (small, small + 1):
        same(real, ours, "POST", "/deregister_peer", raw=json.dumps({"url": "x" * n}).encode())

    bad_input(real, ours)
    same(real, ours, "GET", "/workers")
    for f in ("?model_name=m", "?routing_group=default", "?model_name=zz", "?model_name=",
              "?routing_group=x&model_name=m", "?tenant_id=t"):
        same(real, ours, "GET", "/workers" + f)
    same(real, ours, "GET", "/workers?model_name=a&model_name=b")  # 400: repeated key
    dumps_agree(real, ours)

    peers_and_odd_routes(real, ours)
    unregistrations(real, ours, w1, w2, w2b, w7, questions)


def bad_input(real: Side, ours: Side):
    """Bodies upstream's extractors refuse, each with axum's status and text."""
    good = {"token_ids": T, "model_name": MODEL}
    same(real, ours, "POST", "/query", good, content_type=None)
    same(real, ours, "POST", "/query", good, content_type="text/plain")
    same(real, ours, "POST", "/query", good, content_type="application/vnd.x+json")
    for raw in (b"", b"{", b"[1,]", b"nul"):
        same(real, ours, "POST", "/query", raw=raw)
    for body in ({"token_ids": "x", "model_name": MODEL}, {"token_ids": [-1], "model_name": MODEL},
                 {"token_ids": [2**32], "model_name": MODEL}, {"token_ids": [1.5], "model_name": MODEL},
                 {"model_name": MODEL}, {"token_ids": []}, [], [T], "x", 5,
                 {**good, "routing_group": None}, {**good, "tenant_id": 5}, {**good, "lora_name": 5},
                 {**good, "cache_salt": []}, {**good, "routing_group": ""}, {**good, "extra": {"a": 1}}):
        same(real, ours, "POST", "/query", body)
    for body in ({"block_hashes": [2**64 - 1], "model_name": MODEL},
                 {"block_hashes": [1], "model_name": MODEL, "cache_salt": ""},
                 {"block_hashes": [1], "model_name": "zz", "cache_salt": "s"},
                 {"block_hashes": [1], "model_name": MODEL, "cache_salt": 5},
                 {"block_hashes": [], "model_name": MODEL}, {"block_hashes": [1]}, []):
        same(real, ours, "POST", "/query_by_hash", body)
    for body in ({}, [], {"instance_id": 1}, {"instance_id": -1, "endpoint": "x", "model_name": MODEL,
                                              "block_size": 4}):
        same(real, ours, "POST", "/register", body)
    for body in ({}, [], {"instance_id": 1, "model_name": MODEL, "dp_rank": "0"}):
        same(real, ours, "POST", "/unregister", body)
    same(real, ours, "POST", "/register", {"instance_id": 9}, content_type=None)


def peers_and_odd_routes(real: Side, ours: Side):
    same(real, ours, "GET", "/peers")
    for url in ("http://a:1", "http://b:2", "http://a:1"):
        same(real, ours, "POST", "/register_peer", {"url": url})
    same(real, ours, "GET", "/peers")
    same(real, ours, "POST", "/deregister_peer", {"url": "http://a:1"})
    same(real, ours, "POST", "/deregister_peer", {"url": "http://a:1"})
    same(real, ours, "POST", "/register_peer", [])
    same(real, ours, "GET", "/peers")
    same(real, ours, "POST", "/reopen_logs")
    same(real, ours, "POST", "/reopen_logs", {"x": 1})
    for method, path in (("GET", "/query"), ("POST", "/health"), ("GET", "/nope"), ("DELETE", "/workers"),
                         ("GET", "/register"), ("POST", "/dump")):
        same(real, ours, method, path)


def unregistrations(real: Side, ours: Side, w1, w2, w2b, w7, questions):
    u = lambda **kw: ("POST", "/unregister", {"model_name": MODEL, **kw})  # noqa: E731
    for r in (u(instance_id=9), u(instance_id=1, model_name="x"), u(instance_id=1, routing_group="g"),
              u(instance_id=2, routing_group="default", dp_rank=5)):
        assert same(real, ours, *r)[0] == 404
    # One rank of two: its blocks go, the other's stay.
    assert same(real, ours, *u(instance_id=2, routing_group="default", dp_rank=1))[0] == 200
    same(real, ours, "GET", "/workers")
    settle(real, ours, questions, lambda a: scores(a[0]) == {"1": {"0": 8}}, "worker 2 dp 1's unregistration")
    # Without a routing group the whole instance goes, whatever dp_rank says.
    assert same(real, ours, *u(instance_id=1, dp_rank=7))[0] == 200
    assert same(real, ours, *u(instance_id=2, routing_group="default"))[0] == 200
    assert same(real, ours, *u(instance_id=7, routing_group="default", dp_rank=0))[0] == 200
    same(real, ours, "GET", "/workers")
    same(real, ours, "GET", "/dump")
    # No worker left in the group: no indexer.
    assert settle(real, ours, questions, lambda a: a[0][0] == 404, "the last unregistration")[0][0] == 404
    # Registered again, the rank starts empty (the first registration's blocks are gone).
    assert same(real, ours, "POST", "/register", w1.registration())[0] == 201
    same(real, ours, *questions[0])


def canonical_dump(dump: dict):
    """What a dump says each holder holds, whatever its events' grouping, numbering and block
    names: per indexer, its block size and, per (worker, dp rank, tier), the tokens-hash path
    of every block (module doc of facades/src/http/dump.rs)."""
    out = {}
    for key, ix in dump.items():
        nodes, held = {}, {}
        for ev in ix["events"]:
            e = ev["event"]
            parent = e["data"]["stored"]["parent_hash"]
            for b in e["data"]["stored"]["blocks"]:
                nodes[b["block_hash"]] = (parent, b["tokens_hash"])
                held.setdefault((ev["worker_id"], e["dp_rank"], ev["storage_tier"]), []).append(b["block_hash"])
                parent = b["block_hash"]

        def path(label, depth=0):
            if label is None:
                return ()
            if label not in nodes or depth > 10_000:
                return (f"?{label}",)  # a parent no holder holds: named, not resolved
            parent, tokens = nodes[label]
            return path(parent, depth + 1) + (str(tokens),)

        out[key] = (ix["block_size"], {k: sorted(path(b) for b in v) for k, v in held.items()})
    return out


def dumps_agree(real: Side, ours: Side, keys=None):
    """Waits (bounded) until both dumps hold the same blocks per holder (`canonical_dump`), of
    the indexers `keys` (default: all)."""
    last = {}

    def agree():
        a, b = real.call("GET", "/dump"), ours.call("GET", "/dump")
        assert a[0] == b[0] == 200, (a, b)
        pick = lambda d: {k: v for k, v in d.items() if keys is None or k in keys}  # noqa: E731
        last["real"], last["ours"] = canonical_dump(pick(a[2])), canonical_dump(pick(b[2]))
        return last["real"] == last["ours"]

    deadline = time.monotonic() + 10
    while not agree():
        assert time.monotonic() < deadline, f"dumps differ:\n real: {last['real']}\n ours: {last['ours']}"
        time.sleep(0.1)


def test_pinned_differences(pair, processes):
    """Each deliberate difference of docs/compat/dynamo-mooncake-http.md, as it shows."""
    real, replica, ours = pair
    ke = vllm_events()
    # 1. A store keyed by a cache salt: upstream 1.6.1 hashes its tokens alone and credits them
    #    to unsalted prompts; prefixlog refuses it (it cannot be hashed in Dynamo's scheme).
    s = Engine(ke, 8, 0)
    for side in (real, ours):
        assert side.call("POST", "/register", s.registration(model="salty"))[0] == 201
    attach(real, ours, replica, s, model="salty")
    salted = list(range(500, 508))
    s.send(s.stored([5001, 5002], None, salted, extra_keys=[("tenant-salt",), None]))
    s.send(s.stored([5011], None, T[:4]))
    ask = {"token_ids": T, "model_name": "salty"}
    settle(real, ours, [("POST", "/query", ask)], lambda a: scores(a[0]) == {"8": {"0": 4}}, "the salted store")
    salted_ask = {"token_ids": salted, "model_name": "salty"}
    assert scores(real.call("POST", "/query", salted_ask)) == {"8": {"0": 8}}
    assert scores(ours.call("POST", "/query", salted_ask)) == {}
    assert metric(replica.metrics(), "prefixlog_bridge_events_refused_total", reason="scheme_keys") == 1
    # 2. /dump names a block by the engine hash each holder stored it under; upstream by the
    #    first worker's. Same blocks per holder (canonical_dump compares paths of tokens hashes).
    e = Engine(ke, 3, 0)
    for side in (real, ours):
        assert side.call("POST", "/register", e.registration())[0] == 201
    attach(real, ours, replica, e)
    e.send(e.stored([5101], None, T[:4]))
    settle(real, ours, [("POST", "/query", {"token_ids": T, "model_name": MODEL})],
           lambda a: scores(a[0]) == {"3": {"0": 4}}, "worker 3's store")
    f = Engine(ke, 4, 0)
    for side in (real, ours):
        assert side.call("POST", "/register", f.registration())[0] == 201
    attach(real, ours, replica, f)
    f.send(f.stored([6101], None, T[:4]))
    settle(real, ours, [("POST", "/query", {"token_ids": T, "model_name": MODEL})],
           lambda a: scores(a[0]) == {"3": {"0": 4}, "4": {"0": 4}}, "worker 4's store")
    dumps_agree(real, ours, keys=[f"{MODEL}:default"])
    names = lambda side: {(ev["worker_id"], b["block_hash"])  # noqa: E731
                          for ev in side.call("GET", "/dump")[2][f"{MODEL}:default"]["events"]
                          for b in ev["event"]["data"]["stored"]["blocks"] if b["tokens_hash"] == dynamo_hashes(T[:4], signed=False)[0]}
    assert names(real) == {(3, 5101), (4, 5101)}
    assert names(ours) == {(3, 5101), (4, 6101)}
    # 2b. So upstream cannot find a continuation worker 4 stores from its own name of that block
    #     (its parent 6101): it logs "Failed to find parent block; skipping store operation"
    #     and credits worker 4 with the first block only. prefixlog credits what worker 4 stored.
    #     (vLLM names blocks with a per-process seed unless PYTHONHASHSEED is set: two engines
    #     may well name the same tokens differently.) Worker 4's marker, stored after, says its
    #     continuation was processed on both sides.
    e.send(e.stored([5102], 5101, T[4:8]))
    f.send(f.stored([6102], 6101, T[4:8]))
    f.send(f.stored([6199], None, [77] * BS))
    ask8 = {"token_ids": T[:8], "model_name": MODEL}
    marker = {"token_ids": [77] * BS, "model_name": MODEL}
    for side in (real, ours):
        wait_for(f"{side.name}: worker 3's continuation and worker 4's marker",
                 lambda: (scores(side.call("POST", "/query", ask8)) or {}).get("3") == {"0": 8}
                 and "4" in (scores(side.call("POST", "/query", marker)) or {}), 20)
    assert scores(real.call("POST", "/query", ask8)) == {"3": {"0": 8}, "4": {"0": 4}}
    assert scores(ours.call("POST", "/query", ask8)) == {"3": {"0": 8}, "4": {"0": 8}}
    # 3. A registered rank is the rank its events are filed under; upstream files a batch under
    #    the rank it carries (here an engine of rank 0 registered as rank 1).
    g = Engine(ke, 5, 1, batch_dp=0)
    for side in (real, ours):
        assert side.call("POST", "/register", g.registration())[0] == 201
    attach(real, ours, replica, g, real_dp=0)
    g.send(g.stored([7101], None, T[:4]))
    wait_for("upstream's store", lambda: "5" in (scores(real.query(T)) or {}), 20)
    wait_for("prefixlog's store", lambda: "5" in (scores(ours.query(T)) or {}), 20)
    assert scores(real.query(T))["5"] == {"0": 4}
    assert scores(ours.query(T))["5"] == {"1": 4}
    # 4. The facade's metrics are on the replica's admin port, not on this one.
    assert real.call("GET", "/metrics")[0] == 200
    assert ours.call("GET", "/metrics")[0] == 404
    assert metric(replica.metrics(), "prefixlog_facade_requests_total", protocol="dynamo-http", rpc="register") > 0


def test_bridge_hash_scheme_2_answers_as_dynamo(pair, processes):
    """`prefixlog bridge --hash-scheme 2` files an engine's blocks in Dynamo's scheme: the facade
    answers `/query`, `/query_by_hash` and `/workers` for them as the real indexer does for the
    same engine registered with it."""
    real, replica, ours = pair
    ke = vllm_events()
    e = Engine(ke, 6, 0)
    bridge = Bridge(replica, "b", BS, [f"endpoint={e.endpoint},worker=6"], extra=["--hash-scheme", "2"])
    processes.append(bridge)
    assert real.call("POST", "/register", e.registration(model="b"))[0] == 201
    probe = [777_777] * BS

    def received():
        e.send(e.stored([9_000_001], None, probe))
        seen = "6" in (scores(real.call("POST", "/query", {"token_ids": probe, "model_name": "b"})) or {})
        return seen and metric(bridge.metrics(), "prefixlog_bridge_messages_received_total") > 0

    wait_for("both sides to receive the probe", received, 30, interval=0.1)
    e.send(e.cleared())
    e.send(e.stored(H[:3], None, T[:12]), e.stored([4101, 4102], None, T[:8], lora_name="sql"))
    e.send(e.stored(H[3:4], H[2], T[12:16]))
    qb = lambda **kw: ("POST", "/query", {"token_ids": T, "model_name": "b", **kw})  # noqa: E731
    questions = [qb(), qb(lora_name="sql"), qb(token_ids=probe),
                 ("POST", "/query_by_hash", {"block_hashes": dynamo_hashes(T), "model_name": "b"}),
                 ("POST", "/query_by_hash", {"block_hashes": dynamo_hashes(T[:8], "sql"), "model_name": "b"})]
    a = settle(real, ours, questions, lambda a: scores(a[0]) == {"6": {"0": 16}} and not scores(a[2]),
               "the bridge's stores")
    assert scores(a[1]) == {"6": {"0": 8}} and scores(a[4]) == {"6": {"0": 8}}, a
    same(real, ours, "GET", "/workers?model_name=b")


def test_a_reset_subscription_is_kept_not_restarted(processes):
    """A registered engine's stream that starts over (a late join without a replay socket: the
    subscription clears the worker through the log in a new epoch) keeps its subscription: the
    registrar's reconcile loop must read the new epoch as its own, not as another writer's.
    Restarting it would lose what the engine publishes meanwhile, round after round (seen as a
    worker missing every store of a trace)."""
    ke = vllm_events()
    port = free_port()
    replica = Replica(partitions=2, extra=["--http-indexer-addr", f"127.0.0.1:{port}"])
    processes.append(replica)
    ours = Side("prefixlog", port)
    wait_for("the facade", lambda: ours.call("GET", "/health")[0] == 200, 60)
    e = Engine(ke, 3, 0)
    try:
        n = iter(range(10**6))
        for _ in range(3):  # published before anyone subscribes: the stream is joined late
            e.send(e.stored([9_000 + next(n)], None, [1] * BS))
        time.sleep(0.5)
        assert ours.call("POST", "/register", e.registration())[0] == 201

        def reset_seen():
            e.send(e.stored([9_000 + next(n)], None, [1] * BS))
            return metric(replica.metrics(), "prefixlog_bridge_resets_total", endpoint=e.endpoint) >= 1

        wait_for("the subscription to start over after its late join", reset_seen, 30, interval=0.1)
        time.sleep(3.5)  # three rounds of the registrar's reconcile loop
        mark = [7] * BS
        e.send(e.stored([5_555], None, mark))
        wait_for("the store after the reset indexed",
                 lambda: "3" in (scores(ours.call("POST", "/query", {"token_ids": mark, "model_name": MODEL})) or {}), 20)
        subscribed = replica.log().count("dynamo /register: subscribed")
        assert subscribed == 1, f"the subscription was restarted {subscribed - 1} times:\n{replica.log()[-3000:]}"
    finally:
        e.pub.shutdown()

"""End to end: `prefixlog serve` (embedded broker), 4 fake workers (one without KV events) and
the example gateway; 300 trace requests routed by the index, then the same requests routed
round-robin by a second gateway after the workers' caches are emptied.

Checks: the index-routed hit ratio the workers measured is clearly above the round-robin one;
every routed request left a Placement record in the log, with the answer's offsets; ListWorkers
shows the workers the gateway routes to; a Match names the worker without KV events, which
only placements can have told; and a gateway whose index is down still serves (fail open).

Needs PREFIXLOG_BIN (a prefixlog binary; python/run_tests.sh passes it) and PREFIXLOG_TRACE.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

import prefixlog_client  # noqa: E402
from common import KEYSPACE, TOPIC, prompt_text, tokenize  # noqa: E402
from prefixlog_client import IndexClient, block_hashes  # noqa: E402
from prefixlog_client._proto import records_pb2  # noqa: E402
from send_trace import conversation_requests, hit_ratio, request_for, send  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("PREFIXLOG_BIN")
TRACE = os.environ.get("PREFIXLOG_TRACE", os.path.join(HERE, "..", "..", "data", "mooncake", "conversation_trace.jsonl"))
pytestmark = pytest.mark.skipif(not BIN, reason="PREFIXLOG_BIN not set (run python/run_tests.sh)")
REQUESTS = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout=60.0):
    """Polls `check()` until it returns something truthy (bounded); returns it."""
    end = time.monotonic() + timeout
    while True:
        try:
            got = check()
            if got:
                return got
        except OSError:  # not listening yet
            pass
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


def get_json(url):
    return json.loads(urllib.request.urlopen(url, timeout=10).read())


class Processes:
    """Children started by the test, stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        # No PREFIXLOG_* settings from the caller (`serve` reads e.g. PREFIXLOG_BROKERS); the
        # children import the same prefixlog_client this test does, installed or not.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXLOG_")}
        self.env["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(os.path.dirname(prefixlog_client.__file__)), os.environ.get("PYTHONPATH", "")])

    def start(self, name, args):
        log = open(os.path.join(self.tmp, f"{name}.log"), "w")
        self.procs.append((name, subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=HERE)))
        return os.path.join(self.tmp, f"{name}.log")

    def python(self, name, script, *args):
        return self.start(name, [sys.executable, os.path.join(HERE, script), *map(str, args)])

    def stop(self):
        # Last started first: the workers and gateways flush their producers while the
        # replica's embedded broker still runs.
        for _, p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def procs(tmp_path):
    p = Processes(str(tmp_path))
    yield p
    p.stop()


def placements_in_log(brokers):
    """Every Placement record in the topic, and the high watermarks (next offsets) read up to."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": brokers, "group.id": "gateway-test", "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
        highs = {p: consumer.get_watermark_offsets(confluent_kafka.TopicPartition(TOPIC, p), timeout=10)[1] for p in parts}
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, p, confluent_kafka.OFFSET_BEGINNING) for p in parts])
        seen = {p: 0 for p in parts}
        found = []
        end = time.monotonic() + 60
        while any(seen[p] < highs[p] for p in parts):
            assert time.monotonic() < end, f"could not read the log up to {highs}: at {seen}"
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            seen[msg.partition()] = msg.offset() + 1
            rec = records_pb2.Record.FromString(msg.value())
            if rec.WhichOneof("kind") == "placement":
                found.append((msg.partition(), int.from_bytes(msg.key(), "big"), rec.placement))
        return found, sorted(highs.items())
    finally:
        consumer.close()


def test_the_gateway_routes_by_the_index_and_publishes_placements(procs):
    grpc_port, admin_port = free_port(), free_port()
    serve_log = procs.start("serve", [
        BIN, "serve", "--partitions", "4", "--ready-lag", "0", "--replica-id", "gw-test",
        "--grpc-addr", f"127.0.0.1:{grpc_port}", "--admin-addr", f"127.0.0.1:{admin_port}",
        "--peer-addr", f"127.0.0.1:{free_port()}",
    ])
    brokers = wait_for("the embedded broker", lambda: re.search(r"bootstrap=([0-9.:]+)", open(serve_log).read()))[1]
    wait_for("the replica to be ready", lambda: urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/readyz", timeout=5).status == 200)
    index = f"127.0.0.1:{grpc_port}"

    ports = [free_port() for _ in range(4)]
    workers = [f"http://127.0.0.1:{p}" for p in ports]
    for i, port in enumerate(ports):  # the last one publishes no KV events: placements only
        procs.python(f"worker{i}", "fake_worker.py", "--port", port, "--brokers", brokers, *(["--no-events"] if i == 3 else []))
    ids = [wait_for(f"worker {w}", lambda w=w: get_json(w + "/stats"))["worker"] for w in workers]
    silent = ids[3]

    gateway = f"http://127.0.0.1:{free_port()}"
    # A generous index deadline: on a loaded machine a 50 ms one (the default) would make the
    # gateway fall back now and then, which it may, but this test measures routing by the index.
    procs.python("gateway", "gateway.py", "--port", gateway.rsplit(":", 1)[1], "--index", index, "--brokers", brokers,
                 "--gateway-id", "gw-index", "--deadline-ms", "2000")
    # The gateway knows the workers from ListWorkers (their WorkerAdded records).
    known = wait_for("the gateway to know 4 workers", lambda: len(get_json(gateway + "/workers")) == 4 and get_json(gateway + "/workers"))
    assert sorted(int(w) for w in known) == sorted(ids) and sorted(known.values()) == sorted(workers)

    requests = conversation_requests(TRACE, REQUESTS)
    assert len(requests) == REQUESTS
    routed = send(gateway, requests)
    index_ratio = hit_ratio(workers)
    routes = [r["x-prefixlog-route"].split(":")[0] for r in routed]
    assert routes.count("index") > REQUESTS // 10, routes  # follow-up turns found their holder
    assert set(routes) <= {"index", "balanced", "fallback"}

    # Every routed request left a placement, with the offsets of the answer it routed on.
    def published():
        found, highs = placements_in_log(brokers)
        mine = [(p, key, pl) for p, key, pl in found if pl.gateway == "gw-index"]
        return len(mine) >= REQUESTS and (mine, highs)

    mine, highs = wait_for("the placements", published)
    assert len(mine) == REQUESTS
    with IndexClient([index], deadline=5.0) as c:
        partitions = c.match(KEYSPACE, hashes=[1]).partition_count
    # One placement per request: (the worker it went to, the prompt's block hashes).
    prompts = [block_hashes(tokenize(prompt_text(*request_for(i, ids_))), KEYSPACE[1]) for i, ids_ in enumerate(requests)]
    assert Counter((pl.worker, tuple(pl.local)) for _, _, pl in mine) == Counter(
        (int(r["x-prefixlog-worker"]), tuple(hashes)) for r, hashes in zip(routed, prompts))
    for p, key, pl in mine:
        assert key == pl.worker and p == prefixlog_client.partition_of(pl.worker, partitions)  # keyed, placed
        assert (pl.keyspace.model, pl.keyspace.block_size, pl.keyspace.hash_scheme) == KEYSPACE
    # Routed on an answer: `answered_at` is its `applied`, one next offset per partition.
    answered = sum(not r["x-prefixlog-route"].startswith("fallback: unavailable") for r in routed)
    assert answered > 0 and sum(len(pl.answered_at) == partitions for _, _, pl in mine) == answered

    with IndexClient([index], deadline=5.0) as c:
        listed = c.list_workers(deadline=5.0)
        assert sorted(w.worker for w in listed.workers) == sorted(ids)
        assert {w.worker: w.metadata["serving_url"] for w in listed.workers} == dict(zip(ids, workers))
        # The worker without KV events is known to the index only through placements.
        to_silent = [hashes for hashes, r in zip(prompts, routed) if int(r["x-prefixlog-worker"]) == silent]
        assert to_silent, "no request was routed to the worker without KV events"
        hashes = to_silent[-1]
        answer = c.match(KEYSPACE, hashes=hashes, min_offsets=highs, candidate_workers=[silent])
        assert answer.outcome == "scores" and answer.scores[0].worker == silent, answer
        assert answer.scores[0].inferred and answer.scores[0].depth == len(hashes)

    # The baseline: the same requests, round-robin, on emptied caches.
    for w in workers:
        urllib.request.urlopen(urllib.request.Request(w + "/reset", data=b"{}", method="POST"), timeout=10)
    baseline = f"http://127.0.0.1:{free_port()}"
    procs.python("gateway-rr", "gateway.py", "--port", baseline.rsplit(":", 1)[1], "--index", index, "--brokers", brokers,
                 "--policy", "round-robin", "--gateway-id", "gw-rr")
    wait_for("the round-robin gateway to know 4 workers", lambda: len(get_json(baseline + "/workers")) == 4)
    send(baseline, requests)
    rr_ratio = hit_ratio(workers)
    print(f"prefix hit ratio: index {index_ratio:.3f}, round-robin {rr_ratio:.3f}")
    assert index_ratio > rr_ratio + 0.1 and index_ratio > 1.5 * rr_ratio, (index_ratio, rr_ratio)

    # Fail open: with its index down (nothing listens on port 1), a gateway still routes.
    blind = f"http://127.0.0.1:{free_port()}"
    procs.python("gateway-blind", "gateway.py", "--port", blind.rsplit(":", 1)[1], "--index", "127.0.0.1:1",
                 "--brokers", brokers, "--gateway-id", "gw-blind", *[f"--worker={i}={w}" for i, w in zip(ids, workers)])
    wait_for("the blind gateway", lambda: len(get_json(blind + "/workers")) == 4)
    blind_routes = send(blind, requests[:8])
    assert all(r["x-prefixlog-route"].startswith("fallback: unavailable") for r in blind_routes), blind_routes
    assert len({r["x-prefixlog-worker"] for r in blind_routes}) == 4  # spread over the workers

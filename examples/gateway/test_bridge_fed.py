"""The example gateway in front of bridge-fed workers, as in production: 3 fake workers that
publish only what a vLLM engine publishes (ZeroMQ KV events, `fake_worker.py --kv-events`), a
real `prefixlog bridge` per worker (`--pod-name`, `--serving-url`, the worker id derived from the
pod name), a replica on its embedded broker, and the gateway learning the workers from
ListWorkers -- nothing here announces its own HTTP address except through the bridge.

Checks: ListWorkers names every worker by its serving URL (the bridge's `serving_url`), its pod
and, apart, its ZeroMQ endpoint (`kv_events_endpoint`); the gateway routes to those URLs (every
request it answered was served by the worker its header names); follow-up turns of the trace's
conversations are routed by the index (the bridge's canonical hashes of the engine's token ids
equal the gateway's hashes of the prompt); a routed prompt's worker holds it at full depth; the
bridges' /metrics show the events they published.

Needs PREFIXLOG_BIN (python/run_tests.sh passes it), pyzmq and msgpack.
"""
import os
import re
import urllib.request

import pytest

pytest.importorskip("confluent_kafka")
pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from common import KEYSPACE, prompt_text, tokenize  # noqa: E402
from prefixlog_client import IndexClient, block_hashes  # noqa: E402
from send_trace import conversation_requests, request_for, send  # noqa: E402
from test_gateway import BIN, TRACE, free_port, get_json, procs, wait_for  # noqa: E402,F401

pytestmark = pytest.mark.skipif(not BIN, reason="PREFIXLOG_BIN not set (run python/run_tests.sh)")
WORKERS = 3
REQUESTS = 120


def metric(text, name, **labels):
    """The sum of a family's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_gateway_routes_bridge_fed_workers_by_their_serving_url(procs):
    grpc_port, admin_port = free_port(), free_port()
    serve_log = procs.start("serve", [
        BIN, "serve", "--partitions", "4", "--ready-lag", "0", "--replica-id", "bridge-fed",
        "--grpc-addr", f"127.0.0.1:{grpc_port}", "--admin-addr", f"127.0.0.1:{admin_port}",
        "--peer-addr", f"127.0.0.1:{free_port()}",
    ])
    brokers = wait_for("the embedded broker", lambda: re.search(r"bootstrap=([0-9.:]+)", open(serve_log).read()))[1]
    wait_for("the replica to be ready", lambda: urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/readyz", timeout=5).status == 200)
    index = f"127.0.0.1:{grpc_port}"

    urls, zmq_endpoints, bridge_admins = [], [], []
    for i in range(WORKERS):
        http, zmq_port, bridge_admin = free_port(), free_port(), free_port()
        url, events = f"http://127.0.0.1:{http}", f"tcp://127.0.0.1:{zmq_port}"
        procs.python(f"worker{i}", "fake_worker.py", "--port", http, "--kv-events", events)
        procs.start(f"bridge{i}", [
            BIN, "bridge", "--brokers", brokers, "--partitions", "4", "--model", KEYSPACE[0],
            "--block-size", str(KEYSPACE[1]), "--endpoint", events, "--pod-name", f"fake-worker-{i}",
            "--serving-url", url, "--admin-addr", f"127.0.0.1:{bridge_admin}",
            # A quiet engine is normal here: never re-subscribe (it would lose live batches).
            "--idle-reconnect", "1h", "--metrics-interval", "0s",
        ])
        urls.append(url)
        zmq_endpoints.append(events)
        bridge_admins.append(f"http://127.0.0.1:{bridge_admin}")
    for u in urls:
        wait_for(f"worker {u}", lambda u=u: get_json(u + "/stats"))

    # The bridges announce the workers: named by pod and serving URL, the ZeroMQ address apart.
    with IndexClient([index], deadline=5.0) as c:
        listed = wait_for("3 workers in ListWorkers",
                          lambda: (lambda r: len(r.workers) == WORKERS and r)(c.list_workers(deadline=5.0)))
    by_url = {w.metadata["serving_url"]: w for w in listed.workers}
    assert sorted(by_url) == sorted(urls), [w.metadata for w in listed.workers]
    for i, u in enumerate(urls):
        meta = by_url[u].metadata
        assert meta["pod"] == f"fake-worker-{i}" and meta["kv_events_endpoint"] == zmq_endpoints[i], meta
        assert meta["model"] == KEYSPACE[0] and "endpoint" not in meta, meta
    worker_url = {w.worker: w.metadata["serving_url"] for w in listed.workers}

    gateway = f"http://127.0.0.1:{free_port()}"
    procs.python("gateway", "gateway.py", "--port", gateway.rsplit(":", 1)[1], "--index", index, "--brokers", brokers,
                 "--gateway-id", "gw-bridge-fed", "--deadline-ms", "2000")
    known = wait_for("the gateway to know 3 workers", lambda: len(get_json(gateway + "/workers")) == WORKERS and get_json(gateway + "/workers"))
    assert {int(w): u for w, u in known.items()} == worker_url  # serving URLs, never tcp://

    requests = conversation_requests(TRACE, REQUESTS)
    routed = send(gateway, requests)
    # Every answer came from the worker the gateway says it chose, at that worker's URL.
    served = {u: get_json(u + "/stats")["requests"] for u in urls}
    chosen = {u: 0 for u in urls}
    for r in routed:
        chosen[worker_url[int(r["x-prefixlog-worker"])]] += 1
    assert served == chosen, (served, chosen)
    routes = [r["x-prefixlog-route"].split(":")[0] for r in routed]
    assert routes.count("index") > REQUESTS // 10, routes  # follow-up turns found their holder

    # The bridge-fed index credits a routed prompt to the worker that served it, at full depth.
    last = [(r, block_hashes(tokenize(prompt_text(*request_for(i, ids))), KEYSPACE[1]))
            for i, (r, ids) in enumerate(zip(routed, requests))][-1]
    worker, hashes = int(last[0]["x-prefixlog-worker"]), last[1]
    with IndexClient([index], deadline=5.0) as c:
        answer = wait_for("the last prompt in the index", lambda: (lambda a: a.outcome == "scores" and a.scores[0].depth == len(hashes) and a)(
            c.match(KEYSPACE, hashes=hashes, candidate_workers=[worker])))
    assert answer.scores[0].worker == worker and not answer.scores[0].inferred and not answer.scores[0].gapped, answer

    # The bridges' own account: events published, none refused, no gap, no failed publish.
    published = 0.0
    for admin in bridge_admins:
        text = urllib.request.urlopen(admin + "/metrics", timeout=5).read().decode()
        published += metric(text, "prefixlog_bridge_events_published_total")
        assert metric(text, "prefixlog_bridge_events_refused_total") == 0, text
        assert metric(text, "prefixlog_bridge_resets_total") == 0, text
        assert metric(text, "prefixlog_bridge_batches_total", outcome="publish_failed") == 0, text
        assert metric(text, "prefixlog_build_info") == 1, text
    assert published >= REQUESTS, published
    print(f"bridge-fed: {routes.count('index')} of {REQUESTS} routed by the index; {published:.0f} events published by the bridges")

"""An example prefix-aware HTTP router in front of OpenAI-compatible workers.

    python gateway.py --port 8000 --index 127.0.0.1:50151 --brokers 127.0.0.1:9092

For each POST /v1/completions or /v1/chat/completions it

  1. tokenizes the prompt (common.tokenize, a toy tokenizer) and hashes its blocks
     (prefixlog_client.block_hashes);
  2. asks the index which of the workers it knows holds the longest prefix: `match()` with
     `candidate_workers` = those workers and `exclude_gapped=True` (a worker whose event
     stream lost records may no longer hold what the index credits it with);
  3. routes to the best worker: matched blocks (weighed by storage tier with `--tier-weights`,
     e.g. gpu=1.0,host=0.6,disk=0.3) minus `--load-penalty` per request in flight
     there, ties to the least loaded, then round-robin. If even the best match covers less
     than `--min-match` of the prompt (e.g. only a system prompt every worker has seen), it
     balances instead (least loaded, then round-robin), so that new conversations spread over
     the workers rather than pile onto the first holder of a shared prefix. When the index is
     unavailable or nobody holds a prefix, it falls back to the same: the index is an
     optimisation, never a dependency;
  4. publishes a Placement record (worker, the prompt's block hashes, `answered_at` = the
     answer's `applied` offsets), so the index credits the worker before -- or, for a worker
     without a KV-event bridge, instead of -- its own events;
  5. proxies the request to the worker and returns its answer, with `x-prefixlog-worker` and
     `x-prefixlog-route` headers saying where it went and why.

The workers are read from the index (`ListWorkers`: the `serving_url` and `model` metadata of
their WorkerAdded records -- `prefixlog bridge --serving-url` publishes it -- refreshed every
2 s; workers without a serving URL are not routed to) or given with `--worker ID=URL`. `--discover`
makes `--index` a list of replicas of a sharded index (shard map from Describe). GET /workers
and GET /stats show what the gateway knows and how it routed.
"""
import argparse
import itertools
import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple

from common import KEYSPACE, MODEL, LogPublisher, placement, prompt_text, tokenize
from prefixlog_client import IndexClient, MatchResult, block_hashes

# The worker metadata key naming where its requests go (prefixlog bridge --serving-url; the
# bridge's `kv_events_endpoint` is the engine's ZeroMQ address, never a place for requests).
SERVING_URL = "serving_url"


class Router:
    def __init__(self, index: Optional[IndexClient], publisher: LogPublisher, policy: str, load_penalty: float,
                 min_match: float, gateway_id: str, model: str, static_workers: Dict[int, str],
                 tier_weights: Optional[Dict[str, int]] = None):
        self.index = index
        # Per storage tier, what a matched block there is worth (per mille): a host hit saves
        # most of a prefill, a disk hit less. None: every tier counts as a GPU hit.
        self.tier_weights = tier_weights
        self.publisher = publisher
        self.policy = policy
        self.load_penalty = load_penalty
        self.min_match = min_match
        self.gateway_id = gateway_id
        self.model = model
        self.workers: Dict[int, str] = dict(static_workers)  # worker id -> base URL
        self.static = bool(static_workers)
        self.inflight: Counter = Counter()
        self.routes: Counter = Counter()  # how requests were routed, for GET /stats
        self.lock = threading.Lock()
        self._turn = itertools.count()

    def refresh_workers(self) -> None:
        """The workers of our model announced in the log (ListWorkers), unless given statically.
        An unavailable index keeps the list we had."""
        if self.static or self.index is None:
            return
        listed = self.index.list_workers(deadline=1.0)
        if listed.outcome != "workers":
            return
        workers = {w.worker: w.metadata[SERVING_URL] for w in listed.workers
                   if w.metadata.get("model") == self.model and w.metadata.get(SERVING_URL)}
        # A partial list (a shard of the index did not answer) must not drop that shard's workers.
        self.workers = {**self.workers, **workers} if listed.partial else workers

    def choose(self, hashes: List[int]) -> Tuple[Optional[int], str, Optional[MatchResult]]:
        """(worker, why, the index answer it routed on)."""
        workers = sorted(self.workers)
        if not workers:
            return None, "no workers", None
        turn = next(self._turn) % len(workers)
        order = workers[turn:] + workers[:turn]  # rotating: ties go round-robin
        if self.policy == "round-robin":
            return order[0], "round-robin", None
        answer = None
        if self.index is not None and hashes:
            answer = self.index.match(KEYSPACE, hashes=hashes, candidate_workers=workers, exclude_gapped=True,
                                      tier_weights=self.tier_weights)
        with self.lock:
            load = {w: self.inflight[w] for w in workers}
        if answer is None or answer.outcome != "scores":
            why = "fallback: " + ("prompt shorter than a block" if answer is None else
                                  answer.outcome + (f": {answer.reason}" if answer.reason else ""))
            return min(order, key=lambda w: load[w]), why, answer
        depth: Dict[int, int] = {}
        for s in answer.scores:  # a worker may hold several (dp rank, lane) entries: take its best
            d = s.weighted_score / 1000 if self.tier_weights else s.depth  # blocks, weighed by tier
            depth[s.worker] = max(depth.get(s.worker, 0), d)
        best = max(order, key=lambda w: (depth.get(w, 0) - self.load_penalty * load[w], -load[w]))
        partial = " (partial index answer)" if answer.partial else ""
        if depth.get(best, 0) < self.min_match * len(hashes):
            # Only a short prefix (say, a system prompt everyone shares) is cached anywhere:
            # spread the load instead of piling every new conversation onto its holder.
            return min(order, key=lambda w: load[w]), f"balanced: best match {depth.get(best, 0)} of {len(hashes)} blocks{partial}", answer
        return best, f"index: {depth.get(best, 0)} of {len(hashes)} blocks matched{partial}", answer

    def route(self, path: str, body: dict) -> Tuple[int, bytes, Dict[str, str]]:
        hashes = block_hashes(tokenize(prompt_text(path, body)), KEYSPACE[1])
        worker, why, answer = self.choose(hashes)
        if worker is None:
            return 503, json.dumps({"error": "no workers known"}).encode(), {}
        with self.lock:
            self.inflight[worker] += 1
            self.routes[why.split(":")[0]] += 1
        if hashes:
            answered_at = answer.applied if answer is not None and answer.outcome != "unavailable" else []
            self.publisher.publish(worker, placement(worker, hashes, answered_at, self.gateway_id))
        headers = {"x-prefixlog-worker": str(worker), "x-prefixlog-route": " ".join(why.split())[:300]}
        try:
            req = urllib.request.Request(self.workers[worker] + path, data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read(), headers
        except urllib.error.HTTPError as e:
            return e.code, e.read(), headers
        except (urllib.error.URLError, OSError) as e:
            return 502, json.dumps({"error": f"worker {worker} failed: {e}"}).encode(), headers
        finally:
            with self.lock:
                self.inflight[worker] -= 1


def make_handler(router: Router):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def reply(self, status: int, data: bytes, headers: Dict[str, str] = {}) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/workers":
                self.reply(200, json.dumps({str(w): url for w, url in sorted(router.workers.items())}).encode())
            elif self.path == "/stats":
                with router.lock:
                    stats = {"routes": dict(router.routes), "placements_acked": router.publisher.acked,
                             "placements_failed": router.publisher.failed}
                self.reply(200, json.dumps(stats).encode())
            else:
                self.reply(404, b'{"error": "not found"}')

        def do_POST(self):
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self.reply(404, b'{"error": "not found"}')
                return
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            self.reply(*router.route(self.path, body))

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--index", default="", help="index replica(s), host:port, comma separated")
    ap.add_argument("--discover", action="store_true", help="--index lists the replicas of a sharded index")
    ap.add_argument("--deadline-ms", type=float, default=50.0, help="index query deadline")
    ap.add_argument("--brokers", required=True, help="Kafka bootstrap servers of the prefixlog log (placements)")
    ap.add_argument("--topic", default="prefixlog.records")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--worker", action="append", default=[], metavar="ID=URL", help="a static worker (repeatable)")
    ap.add_argument("--policy", choices=["index", "round-robin"], default="index")
    ap.add_argument("--load-penalty", type=float, default=1.0, help="matched blocks a request in flight costs")
    ap.add_argument("--min-match", type=float, default=0.5,
                    help="route by the index only when the best match covers this share of the prompt's blocks")
    ap.add_argument("--gateway-id", default="example-gateway", help="written into every placement")
    ap.add_argument("--tier-weights", default="",
                    help="weigh matched blocks by storage tier, e.g. gpu=1.0,host=0.6,disk=0.3 (unlisted tiers: 0)")
    a = ap.parse_args()
    weights = {t: round(float(w) * 1000) for t, w in (kv.split("=", 1) for kv in a.tier_weights.split(",") if kv)} or None
    endpoints = [e for e in a.index.split(",") if e]
    index = IndexClient(endpoints, deadline=a.deadline_ms / 1000, discover=a.discover) if endpoints else None
    static = {int(w.split("=", 1)[0]): w.split("=", 1)[1] for w in a.worker}
    router = Router(index, LogPublisher(a.brokers, a.topic), a.policy, a.load_penalty, a.min_match, a.gateway_id, a.model,
                    static, weights)

    def refresh_workers_forever():
        while True:
            router.refresh_workers()
            time.sleep(2.0)

    threading.Thread(target=refresh_workers_forever, name="workers", daemon=True).start()
    server = ThreadingHTTPServer((a.host, a.port), make_handler(router))
    print(f"gateway on http://{a.host}:{a.port} (policy {a.policy}, index {endpoints or 'none'})", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # flush the placements on the way out
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        router.publisher.close()


if __name__ == "__main__":
    main()

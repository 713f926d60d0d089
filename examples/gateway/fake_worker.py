"""A fake OpenAI-compatible inference worker with a prefix cache, publishing its KV events.

    python fake_worker.py --port 8001 --brokers 127.0.0.1:9092
    python fake_worker.py --port 8001 --kv-events tcp://127.0.0.1:5557   # + prefixlog bridge

It keeps an LRU of prompt blocks (BLOCK_SIZE tokens each, the toy tokenizer of common.py) and
publishes what it stores and evicts, in one of two ways:

  * `--brokers`: as a worker and its KV-event bridge in one, straight to the log: one
    KvEventBatch record per request (BlocksStored with `ext` = its own block hash and `local`
    = the canonical hash from prefixlog_client.block_hashes; BlocksRemoved for evictions),
    `seq` increasing, `epoch` = its start time in ms. On start it announces itself with a
    WorkerAdded record whose metadata ({"serving_url": ..., "model": ...}) is what gateways
    read from ListWorkers.
  * `--kv-events tcp://HOST:PORT`: as a vLLM engine (engine_events.py): one ZeroMQ batch per
    request with the block hashes, parents and token ids, and no Kafka at all; a
    `prefixlog bridge --endpoint tcp://HOST:PORT --serving-url http://HOST:PORT --pod-name ...`
    next to it hashes the tokens canonically, publishes the records and announces the worker.

`--no-events` plays an engine without a KV-event bridge: it still announces itself, but the
index learns its blocks only from the placements gateways publish (inferred holders).

Endpoints: POST /v1/completions, /v1/chat/completions (the answer's
usage.prompt_tokens_details.cached_tokens says how many prompt tokens were cached); GET
/v1/models; GET /stats (requests, prompt blocks, blocks already cached: the hit ratio); POST
/reset (empties the cache, published as AllBlocksCleared, and zeroes the stats).
"""
import argparse
import json
import signal
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Optional

import xxhash

import engine_events
from common import BLOCK_SIZE, MODEL, LogPublisher, keyspace_pb, prompt_text, tokenize, worker_added
from prefixlog_client import block_hashes
from prefixlog_client._proto import records_pb2


class PrefixCache:
    """An LRU of blocks keyed by canonical local hash (chained: a block's hash covers its whole
    prefix), publishing every change as the worker's KV events."""

    def __init__(self, worker: int, capacity: int, publisher: Optional[LogPublisher],
                 engine: Optional[engine_events.EnginePublisher] = None):
        self.worker = worker
        self.capacity = capacity
        self.publisher = publisher  # None: no KV events to the log (--no-events, --kv-events)
        self.engine = engine  # --kv-events: what a vLLM engine publishes instead
        self.epoch = int(time.time() * 1000)  # a restarted worker starts a new epoch
        self.seq = 0
        self.blocks: "OrderedDict[int, int]" = OrderedDict()  # local hash -> ext (engine) hash
        self.lock = threading.Lock()
        self.stats = {"requests": 0, "prompt_blocks": 0, "hit_blocks": 0}

    def ext(self, local: int) -> int:
        """The engine's own hash of a block (what its events and removals name)."""
        return xxhash.xxh3_64_intdigest(local.to_bytes(8, "little"), seed=self.worker)

    def serve(self, tokens: List[int]) -> int:
        """Runs a prompt through the cache: returns how many of its leading blocks were cached,
        stores the rest, evicts beyond capacity, publishes the changes."""
        local = block_hashes(tokens, BLOCK_SIZE)
        events = []
        engine = []  # the same changes as a vLLM engine publishes them
        with self.lock:
            hit = 0
            while hit < len(local) and local[hit] in self.blocks:
                hit += 1
            run: List[int] = []  # consecutive blocks not cached: one BlocksStored each run
            for i, h in enumerate(local + [None]):
                if h is not None and h not in self.blocks:
                    run.append(h)
                    continue
                if run:
                    start = i - len(run)
                    stored = records_pb2.BlocksStored(ext=[self.ext(x) for x in run], local=run)
                    if start > 0:
                        stored.parent_ext = self.ext(local[start - 1])
                    events.append(records_pb2.KvEvent(stored=stored))
                    engine.append(engine_events.stored(
                        [self.ext(x) for x in run], self.ext(local[start - 1]) if start > 0 else None,
                        tokens[start * BLOCK_SIZE:i * BLOCK_SIZE], BLOCK_SIZE))
                    for x in run:
                        self.blocks[x] = self.ext(x)
                    run = []
                if h is not None:
                    self.blocks.move_to_end(h)
            evicted = []
            while len(self.blocks) > self.capacity:
                evicted.append(self.blocks.popitem(last=False)[1])
            if evicted:
                events.append(records_pb2.KvEvent(removed=records_pb2.BlocksRemoved(ext=evicted)))
                engine.append(engine_events.removed(evicted))
            self.stats["requests"] += 1
            self.stats["prompt_blocks"] += len(local)
            self.stats["hit_blocks"] += hit
            self._publish(events, engine)
        return hit

    def reset(self) -> None:
        with self.lock:
            self.blocks.clear()
            self.stats = {k: 0 for k in self.stats}
            self._publish([records_pb2.KvEvent(cleared=records_pb2.AllBlocksCleared())], [engine_events.cleared()])

    def _publish(self, events, engine) -> None:
        """One KvEventBatch, or one engine batch (under the lock: seq order is publish order)."""
        if self.engine is not None and engine:
            self.engine.publish(engine)
        if not events or self.publisher is None:
            return
        self.seq += 1
        batch = records_pb2.KvEventBatch(
            worker=self.worker, dp_rank=0, keyspace=keyspace_pb(), epoch=self.epoch, seq=self.seq, events=events
        )
        self.publisher.publish(self.worker, records_pb2.Record(version=1, kv_events=batch))


def make_handler(cache: PrefixCache, model: str):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/stats":
                with cache.lock:
                    self.reply(200, {"worker": cache.worker, **cache.stats})
            elif self.path == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            elif self.path == "/health":
                self.reply(200, {"ok": True})
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            if self.path == "/reset":
                cache.reset()
                self.reply(200, {"ok": True})
                return
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self.reply(404, {"error": "not found"})
                return
            tokens = tokenize(prompt_text(self.path, body))
            hit = cache.serve(tokens)
            text = f"(worker {cache.worker}: {hit} of {len(tokens) // BLOCK_SIZE} prompt blocks were cached)"
            chat = self.path.endswith("/chat/completions")
            choice = {"index": 0, "finish_reason": "stop"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            self.reply(200, {
                "id": f"cmpl-{cache.worker}-{cache.stats['requests']}",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": body.get("model", model),
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(tokens),
                    "completion_tokens": len(text.split()),
                    "total_tokens": len(tokens) + len(text.split()),
                    "prompt_tokens_details": {"cached_tokens": hit * BLOCK_SIZE},
                },
            })

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--brokers", help="Kafka bootstrap servers of the prefixlog log (publish records directly)")
    ap.add_argument("--kv-events", metavar="tcp://HOST:PORT",
                    help="publish vLLM-style KV events on this ZeroMQ endpoint instead (for prefixlog bridge)")
    ap.add_argument("--topic", default="prefixlog.records")
    ap.add_argument("--worker-id", type=int, help="u64 worker id (default: derived from host:port)")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--capacity", type=int, default=1024, help="LRU capacity in blocks")
    ap.add_argument("--no-events", action="store_true", help="publish no KV events (placements only)")
    a = ap.parse_args()
    if bool(a.brokers) == bool(a.kv_events):
        ap.error("give --brokers (records to the log) or --kv-events (engine events for a bridge)")
    url = f"http://{a.host}:{a.port}"
    worker = a.worker_id if a.worker_id is not None else xxhash.xxh3_64_intdigest(url.encode())
    publisher, engine = None, None
    if a.brokers:
        publisher = LogPublisher(a.brokers, a.topic)
        metadata = {"serving_url": url, "model": a.model, "block_size": str(BLOCK_SIZE)}
        publisher.publish(worker, worker_added(worker, metadata))
    else:
        engine = engine_events.EnginePublisher(a.kv_events)
    cache = PrefixCache(worker, a.capacity, None if a.no_events else publisher, engine)
    server = ThreadingHTTPServer((a.host, a.port), make_handler(cache, a.model))
    print(f"fake worker {worker} on {url} (events: {a.kv_events or not a.no_events})", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # flush the producer on the way out
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if publisher is not None:
            publisher.close()
        if engine is not None:
            engine.close()


if __name__ == "__main__":
    main()

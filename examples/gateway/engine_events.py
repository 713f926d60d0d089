"""What a vLLM engine publishes about its KV cache, for the fake worker's `--kv-events` mode.

vLLM started with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557"}'` (SGLang: the same keys) publishes every change of its prefix
cache on a ZeroMQ PUB socket: 3-frame messages [topic, seq as 8 bytes big-endian (0, 1, ...),
msgpack(KVEventBatch)], the batch `{"ts", "events": [...], "data_parallel_rank"}` with events
`{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
"lora_id", "medium", "lora_name"}`, `{"type": "BlockRemoved", "block_hashes", "medium"}` and
`{"type": "AllBlocksCleared"}` (vLLM's `vllm/distributed/kv_events.py`, the map layout).
`prefixlog bridge --endpoint tcp://HOST:5557` subscribes, hashes the token ids canonically and
publishes the log records -- the fake worker then knows nothing of Kafka, as a real engine.

The socket is an XPUB (wire-identical to PUB for subscribers) so the first batch waits until
the bridge has subscribed instead of being dropped (ZeroMQ's slow joiner).
"""
import threading
import time
from typing import List, Optional

import msgpack
import zmq


def stored(block_hashes: List[int], parent: Optional[int], token_ids: List[int], block_size: int) -> dict:
    return {"type": "BlockStored", "block_hashes": block_hashes, "parent_block_hash": parent,
            "token_ids": token_ids, "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None}


def removed(block_hashes: List[int]) -> dict:
    return {"type": "BlockRemoved", "block_hashes": block_hashes, "medium": "GPU"}


def cleared() -> dict:
    return {"type": "AllBlocksCleared"}


class EnginePublisher:
    """Publishes KV-event batches as vLLM does. Thread-safe (one lock around the socket)."""

    def __init__(self, endpoint: str, wait_for_subscriber: float = 60.0):
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.XPUB)
        self._sock.bind(endpoint)
        self._wait = wait_for_subscriber
        self._subscribed = False
        self._lock = threading.Lock()
        self.seq = 0

    def _drain_subscriptions(self, timeout_ms: int) -> None:
        while self._sock.poll(timeout_ms, zmq.POLLIN):
            if self._sock.recv()[:1] == b"\x01":
                self._subscribed = True
            timeout_ms = 0

    def publish(self, events: List[dict]) -> None:
        with self._lock:
            end = time.monotonic() + self._wait
            self._drain_subscriptions(0)
            while not self._subscribed and time.monotonic() < end:
                self._drain_subscriptions(100)
            batch = msgpack.packb({"ts": time.time(), "events": events, "data_parallel_rank": 0}, use_bin_type=True)
            self._sock.send_multipart([b"", self.seq.to_bytes(8, "big"), batch])
            self.seq += 1

    def close(self) -> None:
        with self._lock:
            self._sock.close(linger=1000)
            self._ctx.term()

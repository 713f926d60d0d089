"""A vLLM engine's prefix cache and KV-event publisher, made of vLLM 0.34.0's own code.

Nothing here decides what a block is called or which events go out: the block hashes come from
vLLM's `get_request_block_hasher` (sha256 + its extra keys: LoRA, multimodal inputs at their
offsets, cache salt, hash lookahead), the cache and its events from vLLM's `BlockPool`
(`cache_full_blocks`, eviction when it runs out of blocks, `reset_prefix_cache`), and the wire
from vLLM's `ZmqEventPublisher` (PUB + ROUTER replay). This module only plays the scheduler's
part: it admits a request, reuses its cached prefix, allocates the rest and frees the blocks when
the request finishes (they stay cached until evicted).

`hit_depth(request)` is what the engine itself would hit for a prompt: the leading blocks of the
request's own hashes found in the pool. Tests compare prefixlog's answers with it.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field

import upstream_loader

REAL = [
    "vllm.distributed.kv_events",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.v1.token_buffer",
    "vllm.utils.hashing",
    "vllm.utils.collection_utils",
    "vllm.utils.gc_utils",
    "vllm.envs",
    "vllm.multimodal.utils",
]
upstream_loader.package("vllm", real=REAL)
kv_events = importlib.import_module("vllm.distributed.kv_events")
kv_cache_utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
block_pool = importlib.import_module("vllm.v1.core.block_pool")
hashing = importlib.import_module("vllm.utils.hashing")
kv_cache_utils.init_none_hash(hashing.sha256)
VERSION = upstream_loader.version("vllm")


@dataclass
class MMPosition:
    offset: int
    length: int


@dataclass
class MMFeature:
    """What vLLM's hashing reads of a multimodal input (`MultiModalFeatureSpec`)."""

    identifier: str
    mm_position: MMPosition


@dataclass
class LoRA:
    """What vLLM's hashing and events read of a `LoRARequest`."""

    lora_name: str
    adapter_id: int
    lora_path: str = "/adapters/x"

    @property
    def name(self) -> str:
        return self.lora_name


@dataclass
class Request:
    """The fields of vLLM's `Request` its hashing and `BlockPool` read."""

    tokens: list
    lora: LoRA | None = None
    cache_salt: str | None = None
    mm: list = field(default_factory=list)  # (identifier, offset, length)
    session_id: str | None = None

    def __post_init__(self):
        self.request_id = f"req-{id(self)}"
        self._all_token_ids = list(self.tokens)
        self.all_token_ids = self._all_token_ids
        self.num_tokens = len(self.tokens)
        self.block_hashes = []
        self.mm_features = [MMFeature(i, MMPosition(o, n)) for i, o, n in sorted(self.mm, key=lambda m: m[1])]
        self.lora_request = self.lora
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes = {}

    def query(self) -> dict:
        """The same prompt as prefixlog's client names it."""
        return dict(
            tokens=self.tokens,
            namespace=self.lora.lora_name if self.lora else "",
            cache_salt=self.cache_salt or "",
            mm_inputs=list(self.mm),
        )


class Engine:
    """One vLLM engine rank: a GPU `BlockPool` (and, with `cpu_blocks`, a CPU one standing in
    for an offload tier, publishing with medium CPU), and the ZMQ publisher."""

    def __init__(self, port: int, replay_port: int | None, block_size: int = 16, blocks: int = 64,
                 lookahead: int = 0, buffer_steps: int = 10_000, cpu_blocks: int = 0):
        self.port, self.replay_port, self.block_size, self.lookahead = port, replay_port, block_size, lookahead
        self.buffer_steps = buffer_steps
        self.hasher = kv_cache_utils.get_request_block_hasher(block_size, hashing.sha256, lookahead)
        self.pools = {"GPU": self._pool(blocks, kv_events.MEDIUM_GPU)}
        if cpu_blocks:
            self.pools["CPU"] = self._pool(cpu_blocks, kv_events.MEDIUM_CPU)
        self.drop = lambda seq: False
        self.publisher = None
        self.start()

    def _pool(self, blocks: int, medium: str):
        return block_pool.BlockPool(
            num_gpu_blocks=blocks, enable_caching=True, hash_block_size=self.block_size,
            enable_kv_cache_events=True, num_hash_lookahead_tokens=self.lookahead, medium=medium,
        )

    def start(self):
        """(Re)starts the publisher: a new publisher lifetime numbers batches from 0 again."""
        replay = f"tcp://*:{self.replay_port}" if self.replay_port else None
        self.publisher = kv_events.ZmqEventPublisher(
            data_parallel_rank=0, endpoint=f"tcp://*:{self.port}", replay_endpoint=replay,
            buffer_steps=self.buffer_steps,
        )
        # Message loss on the PUB socket (a slow subscriber past the HWM, a network blip): the
        # publisher still buffers every batch for replay, as vLLM does.
        real_pub, engine = self.publisher._pub, self

        class LossyPub:
            def send_multipart(self, frames, *a, **kw):
                if not engine.drop(int.from_bytes(frames[1], "big")):
                    return real_pub.send_multipart(frames, *a, **kw)

            def __getattr__(self, name):
                return getattr(real_pub, name)

        self.publisher._pub = LossyPub()

    def flush(self) -> int:
        """Waits until the publisher thread has sent everything queued; returns the seq the
        next batch will get."""
        self.publisher._event_queue.join()
        return len(self.publisher._buffer) if self.publisher._buffer.maxlen > len(self.publisher._buffer) else self.publisher._buffer[-1][0] + 1

    def restart(self):
        """The engine process restarts: its caches start empty, its publisher from seq 0."""
        self.publisher.shutdown()
        for medium, pool in list(self.pools.items()):
            self.pools[medium] = self._pool(pool.num_gpu_blocks, pool.medium)
        time.sleep(0.2)  # the OS frees the ports
        self.start()

    def stop(self):
        self.publisher.shutdown()

    def hashes(self, req: Request) -> list:
        r = Request(req.tokens, req.lora, req.cache_salt, req.mm, req.session_id)
        return self.hasher(r)

    def run(self, req: Request, medium: str = "GPU", mutate=None) -> int:
        """Admits `req` on the `medium` pool: reuses its cached prefix, caches the rest (evicting
        the least recently used blocks if the pool is full), publishes the step's events as one
        batch, then frees the request's blocks (they stay cached). `mutate(events)` may change
        the events before they are published (e.g. vLLM's offload manager stamping locality).
        Returns the blocks cached."""
        pool = self.pools[medium]
        req.block_hashes = []
        req.block_hashes = self.hasher(req)
        n = len(req.block_hashes)
        cached = []
        for h in req.block_hashes:
            hit = pool.get_cached_block(h, [0])
            if not hit:
                break
            cached.append(hit[0])
        pool.touch(cached)
        blocks = cached + pool.get_new_blocks(n - len(cached))
        pool.cache_full_blocks(req, blocks, len(cached), n, self.block_size, 0)
        pool.free_blocks(reversed(blocks))
        self.publish(pool.take_events(), mutate)
        return n

    def clear(self, medium: str = "GPU"):
        pool = self.pools[medium]
        assert pool.reset_prefix_cache()
        self.publish(pool.take_events())

    def publish(self, events, mutate=None):
        if mutate:
            mutate(events)
        if events:
            self.publisher.publish(kv_events.KVEventBatch(ts=time.time(), events=events))

    def hit_depth(self, req: Request, medium: str = "GPU") -> int:
        """Blocks of `req` the engine itself would hit on `medium`: its leading hashes cached."""
        depth = 0
        for h in self.hashes(req):
            if not self.pools[medium].get_cached_block(h, [0]):
                break
            depth += 1
        return depth

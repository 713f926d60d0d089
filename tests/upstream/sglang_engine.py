"""An SGLang engine's radix cache and KV-event publisher, made of SGLang 0.5.23's own code.

Nothing here decides which events go out or what they carry: the tree is SGLang's `RadixCache`
(`insert`, `match_prefix` with its node splits, `evict` of the least recently used leaves,
`reset`), whose `KVCacheEventRecorder` turns node inserts and evictions into `BlockStored` /
`BlockRemoved` / `AllBlocksCleared` page by page, coalescing runs, naming LoRA adapters through
`KvEventLoraNames` and namespacing hashes as the configured format says (`KVEventsConfig.format`,
"default" or "dynamo"); the publisher is the one `EventPublisherFactory` builds from a
`--kv-events-config` JSON (`ZmqEventPublisher`: PUB + ROUTER replay, the attention-DP rank
stamped on every batch and added to both ports). This module plays the scheduler's part: it
admits a request (locks its cached prefix, evicts when the pool is full, inserts the page-aligned
prompt, unlocks) and publishes the step's events as one `KVEventBatch`, as
`SchedulerKvEventsPublisher.publish_kv_events` does.

What is not SGLang's own:
- The page hash. SGLang's `get_native_hash` is a C++ extension compiled through torch; it is
  replaced by a SHA-256 chain (`page_hash`: each page's digest over the previous page's digest
  and the page's token ids as little-endian int64, hex). Everything around it is SGLang's:
  `compute_node_hash_values` seeds a chain with the request's namespace
  (`storage_namespace_seed` of extra key and salt), `compute_node_event_hash_values` seeds event
  hashes with the cache salt, the recorder namespaces LoRA (and, in the dynamo format, every
  extra key and salt) with `namespaced_block_hash`. The values differ from a real engine's, but
  prefixlog treats engine hashes as opaque identifiers (it keys blocks by its own hash of the
  token ids and resolves parents and removals by the engine's hash), so only their identity
  matters: the same page under the same namespace gets the same hash, others do not.
- Tensors. torch is stubbed; a node's `value` (its KV slot indices) is a `Slots` list, which is
  all `RadixCache` does with it on these paths (slice, clone, length).
- Tiers. SGLang's host and disk tiers live in its HiCache tree (`UnifiedTreeCore`), which needs
  its controllers and pools. Here each extra medium is a `RadixCache` of its own whose recorder
  stamps that medium (`StorageMedium.CPU` = "CPU_PINNED", `StorageMedium.DISK`), as HiCache's
  calls `record_store(node, medium=StorageMedium.CPU)` do; the page hashes do not depend on the
  tree's shape, so a page has the same hash on every tier. `AllBlocksCleared` comes from the GPU
  tree's `reset` only (SGLang has one tree).

`hit_depth(request)` is what SGLang itself would hit: the pages of the request's page-aligned
prompt its tree matches within the request's namespace (LoRA extra key + cache salt), walked as
`_match_prefix_helper` does but without touching the tree.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import time
import uuid
from array import array
from dataclasses import dataclass
from types import SimpleNamespace

import upstream_loader

REAL = [
    "sglang.srt.disaggregation.kv_events",
    "sglang.srt.mem_cache.events",
    "sglang.srt.mem_cache.utils",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.evict_policy",
]
upstream_loader.package("sglang", real=REAL)
kv_events = importlib.import_module("sglang.srt.disaggregation.kv_events")
events = importlib.import_module("sglang.srt.mem_cache.events")
mem_utils = importlib.import_module("sglang.srt.mem_cache.utils")
radix_cache = importlib.import_module("sglang.srt.mem_cache.radix_cache")
base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
cache_init_params = importlib.import_module("sglang.srt.mem_cache.cache_init_params")
VERSION = upstream_loader.version("sglang")
StorageMedium = kv_events.StorageMedium


def page_hash(token_ids, prior_digest: bytes | None, page_size: int | None = None) -> list[str]:
    """Stands in for SGLang's `get_native_hash` (C++): one hex SHA-256 per page, chained. A page
    is `page_size` logical units: token ids, or (EAGLE) bigrams, hashed as their two ids."""
    units = list(token_ids)
    step = page_size or max(len(units), 1)
    out, digest = [], prior_digest or b""
    for start in range(0, len(units), step):
        flat = [t for u in units[start : start + step] for t in (u if isinstance(u, tuple) else (u,))]
        digest = hashlib.sha256(digest + array("q", flat).tobytes()).digest()
        out.append(digest.hex())
    return out


mem_utils.get_native_hash = page_hash


class Slots(list):
    """A node's KV slot indices (a tensor in SGLang): slicing and `clone` keep the type."""

    def __getitem__(self, i):
        got = list.__getitem__(self, i)
        return Slots(got) if isinstance(i, slice) else got

    def clone(self):
        return Slots(self)


class Allocator:
    """The token-to-KV pool allocator as `RadixCache` uses it: a device and `free_segment`."""

    device = "cpu"

    def free_segment(self, *args, **kwargs):
        pass


class MediumRecorder(events.KVCacheEventRecorder):
    """SGLang's recorder, stamping one medium and the step's session on what it records (the
    calls HiCache's tree and `UnifiedTreeCore` make); `clears` False for a tier's tree, since
    SGLang has one tree and one `AllBlocksCleared`."""

    def __init__(self, medium, clears: bool, **kwargs):
        super().__init__(**kwargs)
        self.medium, self.clears, self.session_id = medium, clears, None

    def record_store(self, node, medium=None, *, session_id=None):
        super().record_store(node, medium or self.medium, session_id=session_id or self.session_id)

    def record_remove(self, node, medium=None):
        super().record_remove(node, medium or self.medium)

    def record_all_cleared(self):
        if self.clears:
            super().record_all_cleared()


@dataclass
class LoRA:
    """A loaded adapter: its public name and SGLang's `lora_id` (a uuid hex string)."""

    name: str
    lora_id: str = ""

    def __post_init__(self):
        self.lora_id = self.lora_id or uuid.uuid5(uuid.NAMESPACE_URL, self.name).hex


@dataclass
class Request:
    """What SGLang's `Req` gives the tree and the event recorder."""

    tokens: list
    lora: LoRA | None = None
    cache_salt: str | None = None
    extra_key: str | None = None  # a caller's own extra key (not a LoRA)
    session_id: str | None = None

    @property
    def lora_id(self):
        return self.lora.lora_id if self.lora else None

    @property
    def key_extra(self) -> str | None:
        """`Req.extra_key`: the caller's extra key with the LoRA id appended."""
        if self.lora is None:
            return self.extra_key
        return (self.extra_key or "") + self.lora.lora_id

    def key(self, bigram: bool = False):
        """The `RadixKey` SGLang builds for the prompt (`bigram`: an EAGLE engine's view)."""
        return radix_cache.RadixKey(array("q", self.tokens), self.key_extra, is_bigram=bigram,
                                    cache_salt=self.cache_salt)

    def query(self) -> dict:
        """The same prompt as prefixlog's client names it."""
        return dict(
            tokens=self.tokens,
            namespace=self.lora.name if self.lora else "",
            cache_salt=self.cache_salt or "",
        )


class Engine:
    """One SGLang scheduler (attention-DP rank `dp_rank`): a GPU radix tree of `capacity`
    tokens, trees for the extra `tiers` (medium name -> capacity), and the ZMQ publisher built
    from the `--kv-events-config` SGLang would get. `port` / `replay_port` are the ports this
    rank binds (the config names them minus the rank, as SGLang adds it). `eagle`: the tree of
    an engine running EAGLE speculative decoding (`is_eagle`: bigram keys, pages published as
    token pairs)."""

    def __init__(self, port: int, replay_port: int | None, page_size: int = 16, capacity: int = 4096,
                 dp_rank: int = 0, format: str = "default", tiers: dict | None = None,
                 adapters: tuple = (), buffer_steps: int = 10_000, eagle: bool = False):
        self.port, self.replay_port, self.page_size, self.dp_rank = port, replay_port, page_size, dp_rank
        self.eagle = eagle
        config = {"publisher": "zmq", "endpoint": f"tcp://*:{port - dp_rank}", "buffer_steps": buffer_steps,
                  "format": format}
        if replay_port:
            config["replay_endpoint"] = f"tcp://*:{replay_port - dp_rank}"
        self.config = json.dumps(config)
        self.dynamo = kv_events.uses_dynamo_format(self.config)
        self.adapters = adapters
        self.capacities = {StorageMedium.GPU: capacity, **{StorageMedium(m): c for m, c in (tiers or {}).items()}}
        self.drop = lambda seq: False
        self.publisher = None
        self.start()

    def _tree(self, medium, capacity: int):
        tree = radix_cache.RadixCache(cache_init_params.CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=Allocator(),
            page_size=self.page_size, is_eagle=self.eagle, enable_kv_cache_events=True,
            dynamo_kv_event_format=self.dynamo, kv_event_lora_names=self.lora_names,
        ))
        first = tree.kv_events.take()  # the AllBlocksCleared of the tree's own reset
        tree.kv_events = MediumRecorder(
            medium, medium == StorageMedium.GPU, enabled=True, page_size=self.page_size,
            dynamo_format=self.dynamo, lora_names=self.lora_names,
        )
        if medium == StorageMedium.GPU:
            tree.kv_events._queue.extend(first)
        tree.capacity = capacity
        return tree

    def start(self):
        """(Re)starts the scheduler: empty trees (the GPU tree's reset records AllBlocksCleared),
        the adapters loaded at startup, a publisher numbering batches from 0."""
        self.lora_names = events.KvEventLoraNames()
        for a in self.adapters:  # `Scheduler.load_lora_adapter` registers each adapter's id
            self.lora_names.register(lora_id=a.lora_id, lora_name=a.name)
        self.trees = {m: self._tree(m, c) for m, c in self.capacities.items()}
        self.publisher = kv_events.EventPublisherFactory.create(self.config, attn_dp_rank=self.dp_rank)
        # Message loss on the PUB socket (a slow subscriber past the HWM, a network blip): the
        # publisher still buffers every batch for replay, as SGLang's does.
        real_pub, engine = self.publisher._pub, self

        class LossyPub:
            def send_multipart(self, frames, *a, **kw):
                if not engine.drop(int.from_bytes(frames[1], "big")):
                    return real_pub.send_multipart(frames, *a, **kw)

            def __getattr__(self, name):
                return getattr(real_pub, name)

        self.publisher._pub = LossyPub()
        self.publish()

    def flush(self) -> int:
        """Waits until the publisher thread has sent everything queued; returns the seq the
        next batch will get."""
        self.publisher._event_queue.join()
        buf = self.publisher._buffer
        return buf[-1][0] + 1 if buf else 0

    def restart(self):
        """The engine process restarts: its trees start empty, its publisher from seq 0."""
        self.publisher.shutdown()
        time.sleep(0.2)  # the OS frees the ports
        self.start()

    def stop(self):
        self.publisher.shutdown()

    def run(self, req: Request, medium=StorageMedium.GPU) -> int:
        """One scheduler step for `req` on `medium`'s tree: registers its adapter's name for
        events, locks its cached prefix, evicts least recently used leaves if the tree lacks
        room, inserts the page-aligned prompt, unlocks, and publishes the step's events.
        Returns the pages the tree holds for it."""
        if req.lora is not None:  # `Scheduler._record_kv_event_lora_name`, given SGLang's `Req`
            self.lora_names.register(SimpleNamespace(extra_key=req.key_extra, lora_id=req.lora_id), req.lora.name)
        tree = self.trees[StorageMedium(medium)]
        key = req.key(self.eagle).page_aligned(self.page_size)
        hit = tree.match_prefix(base.MatchPrefixParams(key=key))
        tree.inc_lock_ref(hit.last_device_node)
        room = tree.capacity - tree.total_size()
        need = len(key) - hit.device_prefix_len
        if need > room:
            tree.evict(base.EvictParams(num_tokens=need - room))
        tree.kv_events.session_id = req.session_id
        tree.insert(base.InsertParams(key=key, value=Slots(range(len(key))), session_id=req.session_id))
        tree.kv_events.session_id = None
        tree.dec_lock_ref(hit.last_device_node)
        self.publish()
        return len(key) // self.page_size

    def evict(self, tokens: int, medium=StorageMedium.GPU):
        """Evicts at least `tokens` tokens of least recently used leaves (memory pressure)."""
        self.trees[StorageMedium(medium)].evict(base.EvictParams(num_tokens=tokens))
        self.publish()

    def clear(self):
        """`flush_cache`: every tree reset (one AllBlocksCleared)."""
        for tree in self.trees.values():
            tree.reset()
        self.publish()

    def publish(self):
        """`SchedulerKvEventsPublisher.publish_kv_events`: the step's events, one batch."""
        batch = [e for tree in self.trees.values() for e in tree.take_events()]
        if batch:
            self.publisher.publish(kv_events.KVEventBatch(ts=time.time(), events=batch))

    def hit_depth(self, req: Request, medium=StorageMedium.GPU) -> int:
        """Pages of `req` SGLang would hit on `medium`: its tree's match of the page-aligned
        prompt in the request's namespace (`RadixCache._match_prefix_helper`, read-only)."""
        tree = self.trees[StorageMedium(medium)]
        ps = self.page_size
        key = req.key(self.eagle).page_aligned(ps)
        node, matched = tree.root_node, 0
        while len(key) > 0:
            child = node.children.get(key.child_key(ps))
            if child is None:
                break
            n = child.key.match(key, page_size=ps)
            matched += n
            if n < len(child.key):
                break
            node, key = child, key[n:]
        return matched // ps

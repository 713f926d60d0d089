#!/usr/bin/env python3
"""A stand-in for vLLM's / SGLang's KV-event publisher, for prefixlog's bridge tests.

Sends exactly what the engines send (vLLM 0.34's and SGLang 0.5.23's `ZmqEventPublisher`,
`vllm/distributed/kv_events.py`): 3-frame messages [topic, seq (8-byte big-endian, from 0,
+1 per batch), msgpack(KVEventBatch)], and answers replay requests on a ROUTER socket
([client_id, b"", start_seq] -> [client_id, b"", topic, seq, payload]... then the end marker
[client_id, b"", b"", (-1).to_bytes(8, "big", signed=True), b""]), keeping the last batches in
a ring buffer as `ZmqEventPublisher` does. The upstream leg (tests/upstream) drives the bridge
with the engines' own publishers from their released wheels; this stand-in keeps the Rust
end-to-end test free of them.

msgspec (vLLM's encoder) and msgpack-python produce the same bytes for these values: ints in
their shortest form (u64 above 2**63, i64 for SGLang's signed hashes), floats as float64,
str as str. Two layouts: positional (msgspec `array_like=True`: batch `[ts, events, dp_rank]`,
event `["BlockStored", hashes, parent, tokens, block_size, lora_id, medium, lora_name,
extra_keys, group_idx, kind, window]`) and map (`{"ts", "events": [{"type": ...}],
"data_parallel_rank"}`, defaults omitted as with `omit_defaults=True`).

The only liberty: the data socket is an XPUB (wire-identical to PUB for subscribers) so the
script can wait until the bridge has subscribed before sending, instead of sleeping.

Usage:
  publisher.py fixtures OUT_DIR        write the decoder fixtures (msgpack payloads)
  publisher.py selfcheck               compare this script's bytes with msgspec's (if installed)
  publisher.py serve-ns --port P      one engine storing blocks with extra_keys (see `serve_ns`)
  publisher.py serve --a P --a-replay P --b P --c P --c-replay P --d P --d-replay P --e P --e-replay P
                                       --f P --f-replay P --j P --k P --l P
                                       run the end-to-end scenario (see `serve`)
Token ids and hashes here are mirrored in tests/tests/bridge.rs and bridge/tests/wire.rs.
"""
import argparse
import collections
import os
import sys
import time

import msgpack

BLOCK = 4
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def toks(base, n):
    return [base + i for i in range(n)]


# --- event builders -------------------------------------------------------------------------

def stored_array(hashes, parent, tokens, *, medium="GPU", lora_name=None, extra_keys=None,
                 tail=(None, None, None)):
    """Current vLLM positional BlockStored; `tail` = [group_idx, kind, window, ...]. msgspec
    writes every field of an array_like struct, defaults included (checked byte for byte
    against msgspec with vLLM's struct definitions), so the default tail is three nils."""
    ev = ["BlockStored", hashes, parent, tokens, BLOCK, None, medium, lora_name, extra_keys]
    return ev + list(tail)


def stored_short(hashes, parent, tokens):
    """SGLang / vLLM 0.9 positional BlockStored: ends at lora_id."""
    return ["BlockStored", hashes, parent, tokens, BLOCK, None]


def stored_map(hashes, parent, tokens, *, medium="GPU", **optional):
    """Map layout with omit_defaults: fields without a default always present, others only
    when set (extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window)."""
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
          "token_ids": tokens, "block_size": BLOCK, "lora_id": None, "medium": medium,
          "lora_name": None}
    ev.update(optional)
    return ev


def batch_array(events, dp_rank=0, ts=None):
    return msgpack.packb([time.time() if ts is None else ts, events, dp_rank], use_bin_type=True)


def batch_short(events, ts=None):
    """SGLang EventBatch(ts, events): no data-parallel rank."""
    return msgpack.packb([time.time() if ts is None else ts, events], use_bin_type=True)


def batch_map(events, dp_rank=None, ts=None, **extra):
    b = {"ts": time.time() if ts is None else ts, "events": events}
    if dp_rank is not None:
        b["data_parallel_rank"] = dp_rank
    b.update(extra)
    return msgpack.packb(b, use_bin_type=True)


# --- the scenario's data (mirrored in tests/tests/bridge.rs) ----------------------------------

A_TOKENS = toks(1000, 20)            # worker 1: 5 blocks
A_HASH = [11, 2**64 - 12, 13, 14, 15]  # one above 2**63: sent as msgpack uint64
B_TOKENS = toks(2000, 12)            # worker 2, dp rank 1
B_HASH = [21, 22, 23, 24]
C_OLD = toks(3000, 12)               # worker 3 before its restart
C_HASH = [-31, -32, -33]             # SGLang: signed int64
C_NEW = toks(4000, 8)
D_HASH = [-41, -42]
D_JOIN = toks(5000, 24)              # worker 4: joined mid-stream, recovered by replay
D_JOIN_HASH = [51, 52, 53, 54, 55, 56]
E_TOKENS = toks(6000, 20)            # worker 5: joined mid-stream, replay buffer too short
E_HASH = [61, 62, 63, 64, 65]
F_OLD = toks(7000, 8)                # worker 6 before a restart the sequence does not show
F_HASH = [71, 72]
G_NEW = toks(8000, 20)               # worker 6 after it
G_HASH = [81, 82, 83, 84, 85]
J_TOKENS = toks(9000, 8)             # worker 7, first of two streams without a dp rank
J_HASH = [91, 92]
K_TOKENS = toks(9500, 4)             # worker 7 again, second stream: its feed is taken
K_HASH = [93]
L_TOKENS = toks(9700, 20)            # worker 8, dp rank 1: resets, never gapped
L_HASH = [101, 102, 103, 104, 105]


def fixtures(out):
    """Decoder fixtures: deterministic payloads (fixed ts) of each layout."""
    os.makedirs(out, exist_ok=True)
    ts = 1700000000.25
    files = {
        # vLLM positional, full field list plus the upstream tail and one unknown extra element,
        # an unknown event type, a removal with group_idx, and a clear.
        "vllm_array.msgpack": batch_array([
            stored_array(A_HASH[:2], None, A_TOKENS[:8]),
            stored_array([A_HASH[2]], A_HASH[1], A_TOKENS[8:12], lora_name="sql-lora",
                         extra_keys=[["salt"]],
                         tail=[1, "sliding_window", 128, None, None, None, None, "future"]),
            ["FutureEvent", 1, 2],
            ["BlockRemoved", [A_HASH[2]], "GPU", 1],
            ["AllBlocksCleared"],
        ], dp_rank=2, ts=ts),
        # Dynamo-style tail: block_mm_infos before group_idx.
        "dynamo_tail.msgpack": batch_array([
            stored_array([7], None, A_TOKENS[:4], tail=[[None], 3, "full_attention", None]),
        ], ts=ts),
        # Map layout (omit_defaults), an unknown key in the batch and in an event.
        "vllm_map.msgpack": batch_map([
            stored_map(B_HASH[:2], None, B_TOKENS[:8], future_key=1),
            stored_map([B_HASH[2]], None, B_TOKENS[:4], group_idx=1,
                       kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128),
            {"type": "BlockRemoved", "block_hashes": [B_HASH[0]], "medium": "CPU"},
            {"type": "AllBlocksCleared"},
            {"type": "SomethingNew", "x": 1},
        ], dp_rank=1, ts=ts, future_batch_key="x"),
        # SGLang: EventBatch(ts, events), short events, signed hashes, one event per page.
        "sglang_short.msgpack": batch_short([
            stored_short([C_HASH[0]], None, C_OLD[:4]),
            stored_short([C_HASH[1]], C_HASH[0], C_OLD[4:8]),
            ["BlockRemoved", [C_HASH[1]]],
        ], ts=ts),
    }
    for name, payload in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(payload)
        print(f"wrote {name} ({len(payload)} bytes)")


# --- a fake engine ----------------------------------------------------------------------------

class Engine:
    """vLLM's ZmqEventPublisher, minus the threads: bind, publish, buffer, answer replays."""

    def __init__(self, ctx, port, replay_port=None, buffer_steps=10_000):
        import zmq
        self.zmq = zmq
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.setsockopt(zmq.LINGER, 1000)
        self.pub.bind(f"tcp://127.0.0.1:{port}")
        self.replay = None
        if replay_port:
            self.replay = ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 1000)
            self.replay.bind(f"tcp://127.0.0.1:{replay_port}")
        self.buffer = collections.deque(maxlen=buffer_steps)
        self.seq = 0
        self.topic = b""
        self.replays = 0

    def pump(self, seconds):
        """Answers replay requests and drains subscription messages for `seconds`; returns
        True if a subscription arrived."""
        zmq = self.zmq
        poller = zmq.Poller()
        poller.register(self.pub, zmq.POLLIN)
        if self.replay is not None:
            poller.register(self.replay, zmq.POLLIN)
        subscribed = False
        deadline = time.time() + seconds
        while True:
            left = deadline - time.time()
            if left <= 0:
                return subscribed
            for sock, _ in poller.poll(int(left * 1000) + 1):
                if sock is self.pub:
                    msg = self.pub.recv()
                    subscribed |= msg[:1] == b"\x01"
                else:
                    self.serve_replay()

    def pump_until(self, cond, timeout=30.0):
        """Pumps (answering replays) until `cond()` holds; exits loudly after `timeout`. Instead
        of a fixed pump(1.0): on a loaded 2-core CI machine the bridge's replay request can come
        later than that."""
        deadline = time.time() + timeout
        while not cond():
            if time.time() >= deadline:
                sys.exit(f"condition not met within {timeout} s (replays answered: {self.replays})")
            self.pump(0.05)

    def wait_subscriber(self, timeout=30.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.pump(0.05):
                # Let the subscriber finish wiring up (and answer any replay meanwhile).
                self.pump(0.1)
                return
        sys.exit("no subscriber connected")

    def serve_replay(self):
        frame = self.replay.recv_multipart()
        if len(frame) != 3:
            print(f"invalid replay request: {frame}", file=sys.stderr)
            return
        client_id, _, start_seq_bytes = frame
        start_seq = int.from_bytes(start_seq_bytes, "big")
        for seq, buf in self.buffer:
            if seq >= start_seq:
                self.replay.send_multipart((client_id, b"", self.topic, seq.to_bytes(8, "big"), buf))
        self.replay.send_multipart((client_id, b"", b"", END_SEQ, b""))
        self.replays += 1

    def publish(self, payload, send=True):
        """Buffers the batch; `send=False` simulates a message the subscriber lost."""
        self.buffer.append((self.seq, payload))
        if send:
            self.pub.send_multipart((self.topic, self.seq.to_bytes(8, "big"), payload))
        self.seq += 1

    def close(self):
        self.pub.close()
        if self.replay is not None:
            self.replay.close()


def serve(a):
    """Three engines, one after the other:
    A (worker 1, vLLM positional, replay): seq 2 is lost and recovered over the replay socket.
    B (worker 2 dp 1, map layout): refused events (token count, unknown medium, an unknown
      field), a LoRA store, a cache-salt store, a host-tier (CPU) store and a lane-1 store
      (group_idx 1).
    L (worker 8 dp 1, map layout, no replay socket): an unknown event type, a lost batch and an
      undecodable message each clear the worker and start over (never gapped).
    C (worker 3, SGLang short positional, signed hashes): stores, removes, then the engine
      restarts (new sockets, seq from 0) and stores a different chain.
    D (worker 4): the bridge joins after seq 0-4; replay from 0 recovers them (not gapped).
    E (worker 5): the same with a 2-batch ring buffer: seq 0-2 are gone: cleared, started over at
      seq 3.
    F (worker 6): restarts and publishes past its old last seq before the bridge re-subscribes.
    J, K (worker 7, no dp rank): two streams for one feed; the second one's batch is refused.
    """
    import zmq
    ctx = zmq.Context()
    eng_a = Engine(ctx, a.a, a.a_replay)
    eng_a.wait_subscriber()
    eng_a.publish(batch_array([stored_array(A_HASH[:2], None, A_TOKENS[:8])]))
    eng_a.publish(batch_array([stored_array([A_HASH[2]], A_HASH[1], A_TOKENS[8:12],
                                            tail=[None, "full_attention", None])]))
    eng_a.publish(batch_array([stored_array([A_HASH[3]], A_HASH[2], A_TOKENS[12:16])]), send=False)
    eng_a.publish(batch_array([stored_array([A_HASH[4]], A_HASH[3], A_TOKENS[16:20])]))
    eng_a.pump_until(lambda: eng_a.replays >= 1)  # answer the replay request
    print(f"engine A done (replays answered: {eng_a.replays})", flush=True)

    eng_b = Engine(ctx, a.b)
    eng_b.wait_subscriber()
    eng_b.publish(batch_map([
        stored_map(B_HASH[:2], None, B_TOKENS[:8]),
        stored_map([B_HASH[2]], None, B_TOKENS[:4], group_idx=1,
                   kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128),
        stored_map([99], None, B_TOKENS[:6]),                  # 6 tokens: refused
        stored_map([98], None, B_TOKENS[:4], medium="CPU"),    # host tier: indexed there
        stored_map([95], None, B_TOKENS[:4], medium="TAPE"),   # unknown medium: refused
        stored_map([97], None, B_TOKENS[:4], lora_name="adapter",
                   extra_keys=[["adapter"]]),          # LoRA by name: its own namespace
        stored_map([96], None, B_TOKENS[:4], extra_keys=[["salt"]]),  # cache_salt: its own chain
        stored_map([94], None, B_TOKENS[:4], future_key=1),  # a field the bridge does not know: refused
    ], dp_rank=1))
    eng_b.publish(batch_map([stored_map([B_HASH[3]], B_HASH[1], B_TOKENS[8:12])], dp_rank=1))
    eng_b.pump(0.5)
    print("engine B done", flush=True)

    # L (worker 8, dp 1, no replay socket): every event it cannot prove clears the worker and
    # starts over, never leaving it gapped: an unknown event type (could have been a removal),
    # a lost batch, an undecodable message. Only the store after the last of them is held.
    eng_l = Engine(ctx, a.l)
    eng_l.wait_subscriber()
    eng_l.publish(batch_map([stored_map([L_HASH[0]], None, L_TOKENS[0:4])], dp_rank=1))
    eng_l.publish(batch_map([stored_map([L_HASH[1]], None, L_TOKENS[4:8]),
                             {"type": "FutureEvent", "x": 1}], dp_rank=1))
    eng_l.publish(batch_map([stored_map([L_HASH[2]], None, L_TOKENS[8:12])], dp_rank=1))
    eng_l.publish(batch_map([{"type": "BlockRemoved", "block_hashes": [L_HASH[2]]}], dp_rank=1),
                  send=False)  # lost, and there is no replay socket
    eng_l.publish(batch_map([stored_map([L_HASH[3]], None, L_TOKENS[12:16])], dp_rank=1))
    # Not msgpack: names no rank; its reset goes to L's feed (dp 1 from its last batch).
    eng_l.publish(b"\xc1 not msgpack")
    eng_l.publish(batch_map([stored_map([L_HASH[4]], None, L_TOKENS[16:20])], dp_rank=1))
    eng_l.pump(0.5)
    print("engine L done", flush=True)

    eng_c = Engine(ctx, a.c, a.c_replay)
    eng_c.wait_subscriber()
    eng_c.publish(batch_short([stored_short([C_HASH[0]], None, C_OLD[:4]),
                               stored_short([C_HASH[1]], C_HASH[0], C_OLD[4:8])]))
    eng_c.publish(batch_short([stored_short([C_HASH[2]], C_HASH[1], C_OLD[8:12])]))
    eng_c.publish(batch_short([["BlockRemoved", [C_HASH[2]]]]))
    eng_c.pump(0.5)
    eng_c.close()
    time.sleep(0.5)
    print("engine C restarting", flush=True)
    eng_c = Engine(ctx, a.c, a.c_replay)
    eng_c.wait_subscriber()
    eng_c.publish(batch_short([stored_short([D_HASH[0]], None, C_NEW[:4])]))
    eng_c.publish(batch_short([stored_short([D_HASH[1]], D_HASH[0], C_NEW[4:8])]))
    eng_c.pump(0.5)
    print("engine C done", flush=True)
    # D: the bridge joins a running engine: seq 0-4 went out before it subscribed (all still in
    # the ring buffer), then seq 5 arrives live: replay from 0 recovers everything.
    eng_d = Engine(ctx, a.d, a.d_replay)
    for i in range(5):
        parent = None if i == 0 else D_JOIN_HASH[i - 1]
        eng_d.publish(batch_array([stored_array([D_JOIN_HASH[i]], parent, D_JOIN[4 * i:4 * i + 4])]),
                      send=False)
    eng_d.wait_subscriber()
    eng_d.publish(batch_array([stored_array([D_JOIN_HASH[5]], D_JOIN_HASH[4], D_JOIN[20:24])]))
    eng_d.pump_until(lambda: eng_d.replays >= 1)
    print(f"engine D done (replays answered: {eng_d.replays})", flush=True)
    # E: the same, but the ring buffer keeps only 2 batches: when the replay request comes (after
    # live seq 4) it holds seq 3-4, so seq 0-2 cannot be recovered: the worker is cleared and
    # starts over at seq 3. Each batch stores one root block.
    eng_e = Engine(ctx, a.e, a.e_replay, buffer_steps=2)
    for i in range(4):
        eng_e.publish(batch_array([stored_array([E_HASH[i]], None, E_TOKENS[4 * i:4 * i + 4])]), send=False)
    eng_e.wait_subscriber()
    eng_e.publish(batch_array([stored_array([E_HASH[4]], None, E_TOKENS[16:20])]))
    eng_e.pump_until(lambda: eng_e.replays >= 1)
    print(f"engine E done (replays answered: {eng_e.replays})", flush=True)
    # F: the engine restarts and has published past the old last seq before the bridge
    # re-subscribes: no sequence goes back; the replay's copy of the old last seq differs.
    eng_f = Engine(ctx, a.f, a.f_replay)
    eng_f.wait_subscriber()
    eng_f.publish(batch_array([stored_array([F_HASH[0]], None, F_OLD[:4])]))
    eng_f.publish(batch_array([stored_array([F_HASH[1]], F_HASH[0], F_OLD[4:8])]))
    eng_f.pump(0.5)
    eng_f.close()
    time.sleep(0.5)
    print("engine F restarting", flush=True)
    eng_f = Engine(ctx, a.f, a.f_replay)
    for i in range(4):
        parent = None if i == 0 else G_HASH[i - 1]
        eng_f.publish(batch_array([stored_array([G_HASH[i]], parent, G_NEW[4 * i:4 * i + 4])]), send=False)
    eng_f.wait_subscriber()
    eng_f.publish(batch_array([stored_array([G_HASH[4]], G_HASH[3], G_NEW[16:20])]))
    # Two replays: the gap (seq 2-3), and the old last seq, whose copy differs (a restart).
    eng_f.pump_until(lambda: eng_f.replays >= 2)
    print(f"engine F done (replays answered: {eng_f.replays})", flush=True)
    # J and K (both worker 7, no dp rank given, batches without one: rank 0): two streams for
    # one feed. J writes first and claims it; K's batch is not published.
    eng_j = Engine(ctx, a.j)
    eng_j.wait_subscriber()
    eng_j.publish(batch_array([stored_array(J_HASH, None, J_TOKENS)]))
    eng_j.pump(0.5)
    eng_k = Engine(ctx, a.k)
    eng_k.wait_subscriber()
    eng_k.publish(batch_array([stored_array(K_HASH, None, K_TOKENS)]))
    eng_k.pump(0.5)
    print("engines J and K done", flush=True)
    for e in (eng_a, eng_b, eng_l, eng_c, eng_d, eng_e, eng_f, eng_j, eng_k):
        e.close()
    ctx.term()
    print("DONE", flush=True)


# --- blocks with extra_keys (mirrored in tests/tests/bridge_namespaces.rs) --------------------

# A vLLM multimodal identifier (the image's hash, as `mm_feature.identifier`).
MM_ID = "9a1f0c3e5b7d2f4a6c8e0b1d3f5a7c9e2b4d6f8a0c1e3b5d7f9a2c4e6b8d0f1a"
NS_MM = toks(10000, 12)      # image over blocks 0-1, text in block 2
NS_SALT = toks(11000, 12)    # cache_salt "tenant-42"; block 2 arrives in a later batch
NS_LORA = toks(12000, 8)     # LoRA "sql-lora"
NS_EMBEDS = toks(13000, 4)   # prompt embeddings: refused


def serve_ns(a):
    """One vLLM engine (positional layout, as vLLM's generate_block_hash_extra_keys fills
    extra_keys: LoRA name, multimodal identifiers, cache salt on the first block only,
    prompt-embeds digests as bytes), then a batch continuing the salted chain."""
    import zmq
    ctx = zmq.Context()
    eng = Engine(ctx, a.port)
    eng.wait_subscriber()
    eng.publish(batch_array([
        stored_array([101, 102, 103], None, NS_MM, extra_keys=[[MM_ID], [MM_ID], None]),
        stored_array([111, 112], None, NS_SALT[:8], extra_keys=[["tenant-42"], None]),
        stored_array([121, 122], None, NS_LORA, lora_name="sql-lora",
                     extra_keys=[["sql-lora"], ["sql-lora"]]),
        stored_array([131], None, NS_EMBEDS, extra_keys=[[bytes(range(32))]]),
    ]))
    eng.publish(batch_array([stored_array([113], 112, NS_SALT[8:])]))
    eng.pump(0.5)
    eng.close()
    ctx.term()
    print("DONE", flush=True)


def selfcheck():
    """Byte-for-byte comparison with msgspec (vLLM's encoder) over vLLM's struct definitions
    (as in vllm/distributed/kv_events.py: array_like + omit_defaults + tag, and the map form
    without array_like). Skipped when msgspec is not installed."""
    try:
        import msgspec
    except ImportError:
        print("selfcheck: NOT RUN (msgspec not installed)")
        return
    from typing import Any, Optional, Union

    def structs(array_like):
        kw = dict(omit_defaults=True, gc=False, array_like=array_like)

        class Batch(msgspec.Struct, **kw):
            ts: float
            events: list[Any]
            data_parallel_rank: Optional[int] = None

        class Ev(msgspec.Struct, tag=True, **kw):
            pass

        class BlockStored(Ev):
            block_hashes: list[int]
            parent_block_hash: Optional[int]
            token_ids: list[int]
            block_size: int
            lora_id: Optional[int]
            medium: Optional[str]
            lora_name: Optional[str]
            extra_keys: Optional[list] = None
            group_idx: Optional[int] = None
            kv_cache_spec_kind: Optional[str] = None
            kv_cache_spec_sliding_window: Optional[int] = None

        class BlockRemoved(Ev):
            block_hashes: list[int]
            medium: Optional[str]

        class AllBlocksCleared(Ev):
            pass

        class KVEventBatch(Batch):
            events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]

        return KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared

    enc = msgspec.msgpack.Encoder()
    ts = 1700000000.25
    for array_like in (True, False):
        KB, BS, BR, AC = structs(array_like)
        want = enc.encode(KB(ts=ts, data_parallel_rank=1, events=[
            BS(A_HASH[:2], None, A_TOKENS[:8], BLOCK, None, "GPU", None),
            BS([A_HASH[2]], A_HASH[1], A_TOKENS[8:12], BLOCK, None, "GPU", None, group_idx=1,
               kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128),
            BR([A_HASH[0]], "GPU"), AC()]))
        if array_like:
            have = batch_array([
                stored_array(A_HASH[:2], None, A_TOKENS[:8]),
                stored_array([A_HASH[2]], A_HASH[1], A_TOKENS[8:12], tail=[1, "sliding_window", 128]),
                ["BlockRemoved", [A_HASH[0]], "GPU"], ["AllBlocksCleared"]], dp_rank=1, ts=ts)
        else:
            have = batch_map([
                stored_map(A_HASH[:2], None, A_TOKENS[:8]),
                stored_map([A_HASH[2]], A_HASH[1], A_TOKENS[8:12], group_idx=1,
                           kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128),
                {"type": "BlockRemoved", "block_hashes": [A_HASH[0]], "medium": "GPU"},
                {"type": "AllBlocksCleared"}], dp_rank=1, ts=ts)
        layout = "positional" if array_like else "map"
        if have != want:
            sys.exit(f"selfcheck: {layout} layout differs from msgspec:\n{msgspec.msgpack.decode(want)}\n"
                     f"{msgspec.msgpack.decode(have)}")
        print(f"selfcheck: {layout} layout identical to msgspec ({len(have)} bytes)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixtures")
    f.add_argument("out")
    sub.add_parser("selfcheck")
    n = sub.add_parser("serve-ns")
    n.add_argument("--port", type=int, required=True)
    s = sub.add_parser("serve")
    for name in ("a", "a-replay", "b", "c", "c-replay", "d", "d-replay", "e", "e-replay", "f",
                 "f-replay", "j", "k", "l"):
        s.add_argument(f"--{name}", type=int, required=True)
    a = p.parse_args()
    if a.cmd == "fixtures":
        fixtures(a.out)
    elif a.cmd == "selfcheck":
        selfcheck()
    elif a.cmd == "serve-ns":
        serve_ns(a)
    else:
        serve(a)


if __name__ == "__main__":
    main()

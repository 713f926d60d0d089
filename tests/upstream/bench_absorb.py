"""Events absorbed per second with publishers that are not the limit (issue 51), for
`bench_dynamo.py`.

In the paced run the Python engines (vLLM's `ZmqEventPublisher`, 256 threads sharing one
interpreter) publish the trace in about two seconds and both sides keep up with them, so that
run measures the publishers. Here every engine's messages are encoded before the clock starts,
by vLLM's own encoder on vLLM's own event classes (`msgspec.msgpack.Encoder` on `KVEventBatch`,
as `ZmqEventPublisher._publisher_thread` does) and framed as that publisher frames them
(topic, 8-byte big-endian sequence, payload). Sending them from Python takes about as long as
either side takes to absorb them, so the side is stopped (SIGSTOP) while they are sent: they
wait in its sockets and in the publishers' queues (vLLM's high-water mark, 100,000 messages),
and the clock starts when the side is let go (SIGCONT). Each side gets its own set of N engine
sockets (the same instance ids, under the model `ABSORB_MODEL`), and the sides are measured one
after the other, so neither competes with the other for the two cores: absorbed per second =
blocks ÷ time from the side's release until every engine's last store (a witness block) is
visible in its `/query`.
"""

from __future__ import annotations

import os
import signal
import time

import zmq

from conftest import free_port

ABSORB_MODEL = "bench-absorb"
WORKER_BASE = 20_000  # instance ids of the absorb engines: apart from the paced run's
COPY_STRIDE = 200_000  # block ids of a trace copy are this far apart (the trace's are < 183,000)


def block_tokens(block_id: int, bs: int) -> list[int]:
    return [block_id * bs + j + 1 for j in range(bs)]


def stored_event(ke, ids: list[int], parent: int | None, bs: int, hash_base: int):
    """vLLM's `BlockStored` of trace blocks `ids` (block i: engine hash `hash_base + i`, tokens
    `block_tokens(i)`) after `parent`; the paced run's engines and the absorb frames both."""
    return ke.BlockStored(
        block_hashes=[hash_base + h for h in ids],
        parent_block_hash=None if parent is None else hash_base + parent,
        token_ids=[t for h in ids for t in block_tokens(h, bs)], block_size=bs, lora_id=None,
        medium="GPU", lora_name=None)


class RawEngine:
    """One engine's PUB socket (vLLM's high-water mark), sending frames made ahead of time."""

    def __init__(self, ctx: zmq.Context, worker: int, bs: int):
        self.worker, self.bs, self.seq = worker, bs, 0
        self.sock = ctx.socket(zmq.PUB)
        self.sock.set_hwm(100_000)
        port = free_port()
        self.sock.bind(f"tcp://*:{port}")
        self.endpoint = f"tcp://127.0.0.1:{port}"

    def registration(self) -> dict:
        return {"instance_id": self.worker, "endpoint": self.endpoint, "model_name": ABSORB_MODEL,
                "block_size": self.bs, "dp_rank": 0}

    def send(self, payload: bytes):
        self.sock.send_multipart((b"", self.seq.to_bytes(8, "big"), payload))
        self.seq += 1

    def close(self):
        self.sock.close(linger=0)


class Frames:
    """vLLM's encoding of each engine's share of the trace, made before the clock starts."""

    def __init__(self, ke, reqs: list[list[int]], n: int, bs: int, hash_base: int, witness: int,
                 copies: int = 1, first_copy: int = 0):
        import msgspec

        assert (first_copy + copies) * COPY_STRIDE < witness, "copies would reach the witness block"
        self.ke, self.bs, self.hash_base = ke, bs, hash_base
        self.enc = msgspec.msgpack.Encoder()
        held: list[set[int]] = [set() for _ in range(n)]
        self.frames: list[tuple[int, bytes]] = []
        self.blocks = 0
        # Copy c of the trace: every block id + c × COPY_STRIDE (other tokens, other blocks).
        copy_ids = ([h + c * COPY_STRIDE for h in r] for c in range(first_copy, first_copy + copies) for r in reqs)
        for i, ids in enumerate(copy_ids):
            e = i % n
            k = 0
            while k < len(ids) and ids[k] in held[e]:
                k += 1
            if k < len(ids):
                self.frames.append((e, self.stored(ids[k:], ids[k - 1] if k else None)))
                held[e].update(ids[k:])
                self.blocks += len(ids) - k
        self.witness_id = witness
        self.witness = [self.stored([witness], None)] * n

    def stored(self, ids: list[int], parent: int | None) -> bytes:
        ev = stored_event(self.ke, ids, parent, self.bs, self.hash_base)
        return self.enc.encode(self.ke.KVEventBatch(ts=time.time(), events=[ev]))


def holders(side, block: int, bs: int) -> set[str]:
    status, _, answer = side.call("POST", "/query", {"token_ids": block_tokens(block, bs), "model_name": ABSORB_MODEL})
    return set((answer.get("scores") or {}).keys()) if status == 200 and isinstance(answer, dict) else set()


def attach(side, engines: list[RawEngine], probe: int, timeout: float):
    """ZeroMQ drops what is published before a subscriber connects: each engine sends a probe
    store until the side credits it."""
    pending, deadline = list(engines), time.monotonic() + timeout
    while pending:
        assert time.monotonic() < deadline, f"{side.name}: {len(pending)} absorb engines never attached"
        for e in pending:
            e.send(e.probe)
        time.sleep(0.3)
        seen = holders(side, probe, engines[0].bs)
        pending = [e for e in pending if str(e.worker) not in seen]


def absorb(side, proc, frames: Frames, n: int, bs: int, probe: int,
           timeout: float = 300.0, extra_procs=(), worker_base: int = WORKER_BASE,
           on_clock=None) -> dict:
    """Registers n fresh engines with `side`, attaches them, then sends every frame and the
    witnesses and waits until `side` credits every engine with the witness. Returns blocks,
    seconds, the sender's seconds, and the CPU seconds `proc` (and `extra_procs`) used.
    `on_clock(True)` / `on_clock(False)` are called as the clock starts and stops (a profiler)."""
    ctx = zmq.Context.instance()
    engines = [RawEngine(ctx, worker_base + w, bs) for w in range(n)]
    try:
        for e in engines:
            r = side.call("POST", "/register", e.registration())
            assert r[0] == 201, (side.name, r)
            e.probe = frames.stored([probe], None)
        attach(side, engines, probe, 120 + n / 4)
        # The side is stopped while everything is sent: the messages wait in its sockets and
        # the publishers' queues, and the clock starts when it is let go.
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            for e, payload in frames.frames:
                engines[e].send(payload)
            for e, payload in zip(engines, frames.witness):
                e.send(payload)
            sent = time.monotonic() - t0
            time.sleep(0.5)  # ZeroMQ's I/O thread hands the last frames to the kernel
            if on_clock:
                on_clock(True)
            others0 = [p.cpu_s() for p in extra_procs]
            cpu0, start = proc.cpu_s(), time.monotonic()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        while len(holders(side, frames.witness_id, bs)) < n:
            assert time.monotonic() - start < timeout, f"{side.name}: not caught up within {timeout:.0f} s"
            time.sleep(0.02)  # a query per poll: not to load either side
        took = time.monotonic() - start
        if on_clock:
            on_clock(False)
        return {"blocks": frames.blocks, "seconds": took, "send_seconds": sent,
                "cpu_s": proc.cpu_s() - cpu0, "others_cpu_s": sum(p.cpu_s() - c for p, c in zip(extra_procs, others0)),
                "eps": frames.blocks / took}
    finally:
        for e in engines:
            e.close()

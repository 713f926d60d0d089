"""Side by side with the real Dynamo indexer (issue 51): the same vLLM event streams and the same
HTTP `/query` bodies to `python -m dynamo.indexer` (ai-dynamo-runtime, pins.txt) and to
prefixlog's Dynamo HTTP facade (`prefixlog serve --http-indexer-addr`, embedded broker).

N simulated vLLM engines (default 256) each publish their share of the Mooncake conversation
trace (request i goes to engine i mod N) through vLLM's own `ZmqEventPublisher`; every engine is
registered with both sides by `/register`, so each subscribes itself. A block of the trace
(`hash_ids`) is `--block-size` tokens derived from its id; an engine stores the blocks of a
request it does not hold yet, as vLLM's `BlockPool` does (no eviction). Reported per side:
events absorbed per second until caught up, then the same `/query` bodies closed loop
(`--clients` threads, one persistent connection each): answer agreement on every query (a
difference is printed with its request), queries/s, p50/p99, RSS and CPU per query from /proc.

The Python client spends about a core per 10,000 queries/s, so it limits both sides. With
`prefixlog-lab` at hand (`--load-gen`, default `$PREFIXLOG_LAB_BIN` or the `prefixlog-lab`
beside `$PREFIXLOG_BIN`), the speed is measured by its `load-http` instead, on the same bodies:
closed loop at saturation (`--connections`, `--seconds`), then open loop on both sides at the
same offered rate (`--open-fraction` of the real indexer's saturated queries/s), where p99 is
compared; CPU per query is the server's CPU over every query sent in the closed loop.

    PREFIXLOG_BIN=... PREFIXLOG_LAB_BIN=... "$(bash tests/upstream/venv.sh)" \
        tests/upstream/bench_dynamo.py --engines 256

Without the load generator the last line is `vs dynamo.indexer: queries/s X.XXx, p99 X.XXx, RSS
X.XXx, events/s X.XXx, answers differ N of M` (prefixlog over dynamo.indexer; the Python
client's figures and the paced publishers' events/s). With it, that line is labelled `(python
client)`, then comes `vs dynamo.indexer (load-http): queries/s X.XXx, p99 at N/s X.XXx,
CPU/query X.XXx, RSS X.XXx, CPU/event X.XXx` (CPU/event: CPU per block absorbed while the paced
engines published), then the unpaced absorb rounds (`bench_absorb.py`, `--absorb-rounds`: each
side alone, the publishers' frames made ahead of time), and last the issue's line again, from
the load generator's queries/s, p99 at the same offered rate and RSS, and the absorb rounds'
events/s (each side's fastest round).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent / "python"))

from conftest import Replica, free_port, metric, wait_for  # noqa: E402
from test_dynamo_http import Side, Upstream, vllm_events  # noqa: E402
from bench_absorb import ABSORB_MODEL, COPY_STRIDE, Frames, absorb, block_tokens, stored_event  # noqa: E402

TRACE = HERE.parent.parent / "data" / "mooncake" / "conversation_trace.jsonl"
MODEL = "bench"
HASH_BASE = 10_000_000  # an engine hash: the block's trace id + this (one vLLM build, one name)
MARK_ID = 9_999_999  # the trace id of the block every engine stores last (caught-up witness)


def load_trace(limit: int | None = None) -> list[list[int]]:
    with open(TRACE) as f:
        reqs = [json.loads(line)["hash_ids"] for line in f if line.strip()]
    return reqs[:limit] if limit else reqs


def prompt(hash_ids: list[int], bs: int) -> list[int]:
    return [t for h in hash_ids for t in block_tokens(h, bs)]


class TraceEngine:
    """One vLLM engine rank: vLLM's publisher, the blocks it holds, and its share of the trace."""

    def __init__(self, ke, worker: int, bs: int):
        self.ke, self.worker, self.bs = ke, worker, bs
        base = free_port()
        self.pub = ke.ZmqEventPublisher(data_parallel_rank=0, endpoint=f"tcp://*:{base}")
        self.endpoint = f"tcp://127.0.0.1:{base}"
        self.held: set[int] = set()

    def registration(self) -> dict:
        return {"instance_id": self.worker, "endpoint": self.endpoint, "model_name": MODEL,
                "block_size": self.bs, "dp_rank": 0}

    def send(self, *events):
        self.pub.publish(self.ke.KVEventBatch(ts=time.time(), events=list(events)))

    def stored(self, ids: list[int], parent: int | None):
        return stored_event(self.ke, ids, parent, self.bs, HASH_BASE)

    def admit(self, hash_ids: list[int]) -> int:
        """Stores the blocks of a request past its held prefix; returns the blocks stored."""
        n = 0
        while n < len(hash_ids) and hash_ids[n] in self.held:
            n += 1
        new = hash_ids[n:]
        if new:
            self.send(self.stored(new, hash_ids[n - 1] if n else None))
            self.held.update(new)
        return len(new)

    def flush(self):
        self.pub._event_queue.join()

    def stop(self):
        self.pub.shutdown()


def scores(answer) -> dict:
    return (answer[2].get("scores") if isinstance(answer[2], dict) else None) or {}


def attach_all(real: Side, ours: Side, replica: Replica, engines: list[TraceEngine]):
    """ZeroMQ drops what is published before a subscriber connects: each engine publishes a
    probe until both sides have received it, then clears it (both start from an empty rank)."""
    pending = list(engines)
    deadline = time.monotonic() + 120 + len(engines) / 4
    while pending:
        assert time.monotonic() < deadline, f"{len(pending)} engines never reached both sides"
        for e in pending:
            e.send(e.stored([MARK_ID - 1 - e.worker], None))
        time.sleep(0.3)
        text = replica.metrics()
        still = []
        for e in pending:
            probe = {"token_ids": block_tokens(MARK_ID - 1 - e.worker, e.bs), "model_name": MODEL}
            seen = str(e.worker) in scores(real.call("POST", "/query", probe))
            got = metric(text, "prefixlog_bridge_messages_received_total", endpoint=e.endpoint)
            if not (seen and got > 0):
                still.append(e)
        pending = still
    for e in engines:
        e.send(e.ke.AllBlocksCleared())


def caught_up_watch(side: Side, n: int, bs: int, start: float, out: dict, key: str, proc=None, cpu0=0.0):
    """Polls the witness block every engine stores last; records when all n hold it (and, with
    `proc`, the CPU seconds it used since `cpu0`: `out[key + "_cpu"]`)."""
    body = {"token_ids": block_tokens(MARK_ID, bs), "model_name": MODEL}
    while time.monotonic() - start < 300:
        if len(scores(side.call("POST", "/query", body))) >= n:
            out[key] = time.monotonic() - start
            if proc is not None:
                out[key + "_cpu"] = proc.cpu_s() - cpu0
            return
        time.sleep(0.02)


def explain_not_caught_up(real: Side, ours: Side, replica: Replica, engines: list[TraceEngine]):
    """Prints which workers each side lacks the witness for, the bridge's counters and the
    replica's log tail: what a failed run needs to be understood afterwards."""
    body = {"token_ids": block_tokens(MARK_ID, engines[0].bs), "model_name": MODEL}
    for side in (real, ours):
        held = scores(side.call("POST", "/query", body))
        print(f"{side.name}: witness missing on workers {sorted(e.worker for e in engines if str(e.worker) not in held)}")
    text = replica.metrics()
    print("\n".join(l for l in text.splitlines()
                    if l.startswith(("prefixlog_bridge_", "prefixlog_ingest_", "prefixlog_apply_")) and not l.endswith(" 0")))
    print("----- replica log tail -----\n" + "\n".join(replica.log().splitlines()[-60:]))


def publish_trace(real, ours, engines, reqs, procs: dict | None = None) -> tuple[int, dict]:
    """Publishes every engine's share, then the witness; returns (blocks, side -> seconds, and
    with `procs` (side name -> Proc) side + "_cpu" -> CPU seconds until caught up). The Python
    engines set the pace, so the seconds say how fast both kept up with them, and the CPU what
    absorbing the events cost each side."""
    n, bs = len(engines), engines[0].bs
    procs = procs or {}
    cpu0 = {name: p.cpu_s() for name, p in procs.items()}
    start, out = time.monotonic(), {}
    watchers = [threading.Thread(target=caught_up_watch,
                                 args=(s, n, bs, start, out, s.name, procs.get(s.name), cpu0.get(s.name, 0.0)))
                for s in (real, ours)]
    blocks = 0
    for i, r in enumerate(reqs):
        blocks += engines[i % n].admit(r)
    for e in engines:
        e.send(e.stored([MARK_ID], None))
    for w in watchers:
        w.start()
    for w in watchers:
        w.join()
    return blocks, out


class Proc:
    """RSS and CPU of a process from /proc."""

    def __init__(self, pid: int):
        self.pid = pid

    def rss_mb(self) -> float:
        for line in open(f"/proc/{self.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        fields = open(f"/proc/{self.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(port: int, bodies: list[bytes], clients: int, proc: Proc) -> dict:
    """Closed loop: `clients` threads, each its own connection, take the next body until done."""
    answers: list = [None] * len(bodies)
    lat: list[float] = [0.0] * len(bodies)
    nxt = iter(range(len(bodies)))
    lock = threading.Lock()

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            t = time.perf_counter()
            conn.request("POST", "/query", bodies[i], {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            lat[i] = time.perf_counter() - t
            answers[i] = (r.status, json.loads(data) if data else None)

    cpu0, me0, t0 = proc.cpu_s(), time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(worker) for _ in range(clients)]:
            f.result()
    wall = time.perf_counter() - t0
    s = sorted(lat)
    return {"answers": answers, "qps": len(bodies) / wall, "p50": s[len(s) // 2] * 1e3,
            "p99": s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3, "rss": proc.rss_mb(),
            "cpu_us": (proc.cpu_s() - cpu0) / len(bodies) * 1e6,
            "client_cores": (time.process_time() - me0) / wall}


def lab_binary(given: str | None) -> str | None:
    """The `prefixlog-lab` to drive the load with, or None (the Python client then measures)."""
    for cand in (given, os.environ.get("PREFIXLOG_LAB_BIN"),
                 str(Path(os.environ["PREFIXLOG_BIN"]).with_name("prefixlog-lab")) if os.environ.get("PREFIXLOG_BIN") else None,
                 shutil.which("prefixlog-lab")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def load_http(lab: str, port: int, bodies_file: str, proc: Proc, connections: int, seconds: float,
              rate: float | None = None) -> dict:
    """One `prefixlog-lab load-http` run against `port`; its JSON line plus the server's CPU per
    query sent and RSS."""
    cmd = [lab, "load-http", "--url", f"http://127.0.0.1:{port}/query", "--bodies", bodies_file,
           "--connections", str(connections), "--duration", f"{seconds}s", "--warm-up", "1s"]
    if rate:
        cmd += ["--rate", f"{rate:.1f}"]
    cpu0 = proc.cpu_s()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=seconds + 120)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["cpu_us"] = (proc.cpu_s() - cpu0) / max(1, r["sent"]) * 1e6
    r["rss"] = proc.rss_mb()
    return r


def speed_by_load_gen(lab: str, sides: list, bodies: list[bytes], a) -> dict:
    """Closed loop on each side, then both at the same offered rate (a fraction of the real
    indexer's saturated queries/s)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(b"\n".join(bodies) + b"\n")
        bodies_file = f.name
    try:
        res = {name: {"closed": load_http(lab, port, bodies_file, proc, a.connections, a.seconds)}
               for name, port, proc in sides}
        rate = max(1.0, res["dynamo"]["closed"]["qps"] * a.open_fraction)
        for name, port, proc in sides:
            res[name]["open"] = load_http(lab, port, bodies_file, proc, a.connections, a.seconds, rate)
        res["rate"] = rate
        for name, _, _ in sides:
            c, o = res[name]["closed"], res[name]["open"]
            print(f"{name:>15} (load-http): closed loop {c['qps']:,.0f} queries/s p50 {c['p50_us']} us "
                  f"p99 {c['p99_us']} us, {c['errors']} errors, CPU/query {c['cpu_us']:.0f} us, RSS {c['rss']:.0f} MB; "
                  f"open loop at {rate:,.0f}/s p50 {o['p50_us']} us p99 {o['p99_us']} us p99.9 {o['p999_us']} us "
                  f"({o['qps']:,.0f}/s answered; client used {c['client_cores']:.2f} cores closed)")
        failed = {f"{name} {mode}": res[name][mode]["errors"] for name, _, _ in sides for mode in ("closed", "open")
                  if res[name][mode]["errors"]}
        # Ratios over refused or failed queries would compare nothing: a run with any is void.
        assert not failed, f"load-http saw queries answered with an error or not at all: {failed}"
        return res
    finally:
        os.unlink(bodies_file)


def absorb_rounds(ke, reqs, n: int, bs: int, rounds: int, copies: int, sides: dict) -> dict:
    """`bench_absorb`: each round new blocks (copies of the trace no round sent, named
    as the paced run names blocks: one engine hash per token block) on new engines, the sides
    one after the other, the order alternating between rounds; per side the fastest round."""
    best: dict = {}
    for r in range(rounds):
        frames = Frames(ke, reqs, n, bs, HASH_BASE, witness=MARK_ID - 100 - r, copies=copies,
                        first_copy=r * copies)
        order = ["dynamo", "prefixlog"] if r % 2 == 0 else ["prefixlog", "dynamo"]
        for name in order:
            side, proc, others = sides[name]
            m = absorb(side, proc, frames, n, bs, probe=MARK_ID - 1 - r,
                       extra_procs=others, worker_base=20_000 + r * n)
            extra = f", broker process {m['others_cpu_s'] / m['blocks'] * 1e6:.2f}" if others else ""
            print(f"absorb round {r + 1}, {name:>9}: {m['blocks']:,} blocks in {m['seconds']:.2f} s "
                  f"({m['eps']:,.0f}/s; queued while it was stopped, sent in {m['send_seconds']:.2f} s), CPU per 1,000 blocks "
                  f"{m['cpu_s'] / m['blocks'] * 1e6:.2f} ms{extra}", flush=True)
            if name not in best or m["eps"] > best[name]["eps"]:
                best[name] = m
    # Both sides were sent the same events: they must answer alike.
    (real, _, _), (ours, _, _) = sides["dynamo"], sides["prefixlog"]
    sent = [[h + c * COPY_STRIDE for h in r] for c in range(rounds * copies) for r in reqs]
    bodies = query_bodies(sent, 300, bs, seed=11, model=ABSORB_MODEL)
    settle(real, ours, bodies)
    best["differ"], best["queries"] = sum(1 for b in bodies if ask(real, b) != ask(ours, b)), len(bodies)
    print(f"absorbed events: {len(bodies) - best['differ']} of {len(bodies)} queries answered the same", flush=True)
    return best


def query_bodies(reqs: list[list[int]], m: int, bs: int, seed: int, model: str = MODEL) -> list[bytes]:
    """`m` prompts: trace requests chosen at random, half of them with a new suffix block."""
    rnd = random.Random(seed)
    out = []
    for k in range(m):
        ids = list(rnd.choice(reqs))
        if k % 2:
            ids = ids[: rnd.randint(1, len(ids))] + [MARK_ID + 1 + k]
        out.append(json.dumps({"token_ids": prompt(ids, bs), "model_name": model}).encode())
    return out


def ask(side: Side, body: bytes):
    status, _, answer = side.call("POST", "/query", raw=body)
    return status, answer if answer != "" else None


def settle(real: Side, ours: Side, bodies: list[bytes], timeout: float = 60.0) -> float:
    """Waits (bounded) until a sample of the queries is answered the same by both: the witness
    says every engine's last event arrived, not that every partition applied all before it.
    Returns the seconds waited."""
    t0 = time.monotonic()
    sample = bodies[:: max(1, len(bodies) // 40)]
    while any(ask(real, b) != ask(ours, b) for b in sample) and time.monotonic() - t0 < timeout:
        time.sleep(0.2)
    return time.monotonic() - t0


def differences(real: Side, ours: Side, bodies, real_answers, ours_answers, show: int = 5) -> int:
    """Counts the queries answered differently; each shown is asked again after the run, to
    tell a lasting difference from one that was still being applied."""
    n = 0
    for body, a, b in zip(bodies, real_answers, ours_answers):
        if a != b:
            n += 1
            if n <= show:
                again = "still differs" if ask(real, body) != ask(ours, body) else "equal when asked again"
                print(f"DIFFERENT answer ({again}) to {body[:200]!r}...\n  dynamo.indexer: {a}\n  prefixlog:      {b}")
    return n


def run(engines: int, queries: int, clients: int, bs: int, limit: int | None, seed: int = 7,
        speed: argparse.Namespace | None = None) -> dict:
    """One side-by-side run; returns the measurements (also printed). With `speed` (the
    load-http options), the speed is measured again by `prefixlog-lab load-http`."""
    ke = vllm_events()
    # vLLM's publishers share ZeroMQ's process-wide context, which allows 1,023 sockets by
    # default; each engine has two (PUB and replay ROUTER).
    import zmq

    zmq.Context.instance().set(zmq.MAX_SOCKETS, max(1024, 4 * engines + 64))
    reqs = load_trace(limit)
    up = Upstream()
    port = free_port()
    # With `speed`, the log lives in a process of its own (another replica's embedded broker,
    # as Kafka would be elsewhere in production), so the measured replica's RSS and CPU are its
    # own, as the real indexer's are.
    broker = Replica(name="broker", partitions=2) if speed is not None else None
    replica = Replica(partitions=2, brokers=broker.brokers if broker else None,
                      extra=["--http-indexer-addr", f"127.0.0.1:{port}"])
    real, ours = up.side, Side("prefixlog", port)
    started = []
    try:
        wait_for("the facade", lambda: ours.call("GET", "/health")[0] == 200, 60)
        started = [TraceEngine(ke, w + 1, bs) for w in range(engines)]
        for e in started:
            for side in (real, ours):
                r = side.call("POST", "/register", e.registration())
                assert r[0] == 201, (side.name, r)
        attach_all(real, ours, replica, started)
        time.sleep(1.0)  # the clears applied on both sides
        procs = {"dynamo": Proc(up.proc.pid), "prefixlog": Proc(replica.proc.pid)}
        blocks, took = publish_trace(real, ours, started, reqs, procs)
        if not {"dynamo", "prefixlog"} <= took.keys():
            explain_not_caught_up(real, ours, replica, started)
        assert {"dynamo", "prefixlog"} <= took.keys(), f"not caught up within 300 s: {took}"
        cpu_per_k = {k: took[k + "_cpu"] / blocks * 1e6 for k in procs if k + "_cpu" in took}  # ms per 1,000 blocks
        print(f"trace: {len(reqs)} requests, {blocks} blocks stored on {engines} engines; caught up "
              f"after dynamo.indexer {took.get('dynamo', float('nan')):.2f} s, "
              f"prefixlog {took.get('prefixlog', float('nan')):.2f} s; CPU per 1,000 blocks absorbed "
              f"dynamo.indexer {cpu_per_k.get('dynamo', float('nan')):.1f} ms, "
              f"prefixlog {cpu_per_k.get('prefixlog', float('nan')):.1f} ms (replica and its engine feeds"
              f"{'' if broker else ', embedded broker'})")
        bodies = query_bodies(reqs, queries, bs, seed)
        print(f"both answered a sample of the queries the same after {settle(real, ours, bodies):.1f} s more")
        res = {}
        for side, pid in ((real, up.proc.pid), (ours, replica.proc.pid)):
            p = int(side.base.rsplit(":", 1)[1])
            drive(p, bodies[: min(50, len(bodies))], clients, Proc(pid))  # warm-up
            res[side.name] = drive(p, bodies, clients, Proc(pid))
            res[side.name]["eps"] = blocks / took[side.name] if side.name in took else 0.0
            res[side.name]["event_cpu_ms_per_k"] = cpu_per_k.get(side.name, float("nan"))
        for name, r in res.items():
            print(f"{name:>15}: events/s {r['eps']:,.0f}  queries/s {r['qps']:,.0f}  p50 {r['p50']:.2f} ms  "
                  f"p99 {r['p99']:.2f} ms  RSS {r['rss']:.0f} MB  CPU/query {r['cpu_us']:.0f} us  "
                  f"(client used {r['client_cores']:.2f} cores)")
        d, o = res["dynamo"], res["prefixlog"]
        if max(d["client_cores"], o["client_cores"]) > 0.8:
            print("note: the Python client used most of a core: it may limit queries/s on both sides")
        diff = differences(real, ours, bodies, d["answers"], o["answers"])
        res["differ"], res["queries"] = diff, len(bodies)
        nonempty = sum(1 for a in d["answers"] if a and a[0] == 200 and a[1].get("scores"))
        print(f"answers: {len(bodies) - diff} of {len(bodies)} equal; {nonempty} name at least one worker")
        ratio = lambda a, b: a / b if b else float("nan")  # noqa: E731
        lab = lab_binary(speed.load_gen) if speed is not None else None
        # With the load generator its line (the last) is the issue's; this one is the Python client's.
        label = " (python client)" if lab else ""
        print(f"vs dynamo.indexer{label}: queries/s {ratio(o['qps'], d['qps']):.2f}x, p99 {ratio(o['p99'], d['p99']):.2f}x, "
              f"RSS {ratio(o['rss'], d['rss']):.2f}x, events/s {ratio(o['eps'], d['eps']):.2f}x, "
              f"answers differ {diff} of {len(bodies)}")
        if speed is None:
            return res
        if lab is None:
            print("no prefixlog-lab for load-http (--load-gen, PREFIXLOG_LAB_BIN): speed measured by the Python client only")
            return res
        fast = speed_by_load_gen(lab, [("dynamo", int(real.base.rsplit(":", 1)[1]), Proc(up.proc.pid)),
                                       ("prefixlog", port, Proc(replica.proc.pid))], bodies, speed)
        d, o = fast["dynamo"], fast["prefixlog"]
        print(f"vs dynamo.indexer (load-http): queries/s {ratio(o['closed']['qps'], d['closed']['qps']):.2f}x, "
              f"p99 at {fast['rate']:.0f}/s {ratio(o['open']['p99_us'], d['open']['p99_us']):.2f}x, "
              f"CPU/query {ratio(o['closed']['cpu_us'], d['closed']['cpu_us']):.2f}x, "
              f"RSS {ratio(o['closed']['rss'], d['closed']['rss']):.2f}x, "
              f"CPU/event {ratio(res['prefixlog']['event_cpu_ms_per_k'], res['dynamo']['event_cpu_ms_per_k']):.2f}x")
        res["load_http"] = fast
        if speed.absorb_rounds:
            res["absorb"] = absorb_rounds(ke, reqs, engines, bs, speed.absorb_rounds, speed.absorb_copies,
                                          {"dynamo": (real, Proc(up.proc.pid), ()),
                                           "prefixlog": (ours, Proc(replica.proc.pid),
                                                         (Proc(broker.proc.pid),) if broker else ())})
        a = res.get("absorb", {})
        eps = ratio(a["prefixlog"]["eps"], a["dynamo"]["eps"]) if a else ratio(o["eps"], d["eps"])
        print(f"vs dynamo.indexer: queries/s {ratio(fast['prefixlog']['closed']['qps'], fast['dynamo']['closed']['qps']):.2f}x, "
              f"p99 {ratio(fast['prefixlog']['open']['p99_us'], fast['dynamo']['open']['p99_us']):.2f}x, "
              f"RSS {ratio(fast['prefixlog']['closed']['rss'], fast['dynamo']['closed']['rss']):.2f}x, "
              f"events/s {eps:.2f}x, answers differ {diff + a.get('differ', 0)} of {len(bodies) + a.get('queries', 0)}")
        res["differ"] = diff + a.get("differ", 0)
        return res
    finally:
        for e in started:
            e.stop()
        replica.stop()
        if broker is not None:
            broker.stop()
        up.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=256)
    ap.add_argument("--queries", type=int, default=1500)
    ap.add_argument("--clients", type=int, default=8, help="closed-loop client threads")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--requests", type=int, default=None, help="the first N trace requests (default all)")
    ap.add_argument("--load-gen", default=None, help="prefixlog-lab binary for load-http (default: found)")
    ap.add_argument("--connections", type=int, default=64, help="load-http connections")
    ap.add_argument("--seconds", type=float, default=10.0, help="load-http counted seconds per run")
    ap.add_argument("--absorb-rounds", type=int, default=2,
                    help="rounds of the unpaced absorb measurement (bench_absorb.py; 0: none), with the load generator")
    ap.add_argument("--absorb-copies", type=int, default=4,
                    help="copies of the trace (other blocks) each absorb round sends, for a longer measure")
    ap.add_argument("--open-fraction", type=float, default=0.5,
                    help="open-loop offered rate as a fraction of dynamo.indexer's saturated queries/s")
    a = ap.parse_args()
    res = run(a.engines, a.queries, a.clients, a.block_size, a.requests, speed=a)
    sys.exit(1 if res["differ"] else 0)


if __name__ == "__main__":
    main()

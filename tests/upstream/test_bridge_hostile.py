"""Hostile "engines" beside real ones (issue 50: "a raw TCP peer sending a frame header that
declares 2^62 bytes leaves the bridge running and its other engines' feeds flowing").

One `prefixlog bridge` serves two vLLM 0.34 engines (their own `BlockPool`, hashing and
`ZmqEventPublisher`) and five endpoints that are raw TCP listeners, each repeating its attack on
every connection the bridge makes:

- `huge_frame`: completes the ZMTP greeting and handshake as a PUB, then sends the 9-byte
  header of a frame declaring 2^62 bytes (what made the zeromq 0.4.1 decoder abort the process);
- `garbage`: answers the greeting with an HTTP response;
- `huge_command`: after the handshake, a command frame declaring 2^40 bytes;
- `endless_more`: after the handshake, empty MORE frames without end;
- `stall`: after the handshake, declares a frame just under the 64 MiB cap, sends 1 KiB of it and
  stalls, never answering a heartbeat.

Engine 2's replay endpoint is a sixth hostile listener: a ROUTER whose answer declares a 2^62-byte
frame. A message engine 2 loses on the wire therefore cannot be replayed: the bridge counts the
oversized replay and starts the worker over (a new epoch), never crediting what may be gone.

Throughout, the bridge process stays up and its resident memory stays under `RSS_GROWTH` above
what it used before the attacks; each hostile connection ends for its own reason
(`prefixlog_bridge_disconnects_total{reason}`, more than once: the bridge reconnects with
back-off and is dropped again); and every answer the replica gives for the real engines' prompts
equals what the engine itself would hit, before, during and after the attacks.

The attacks' bytes are written here by hand from rfc.zeromq.org 37/ZMTP, not with the bridge's
own encoder.
"""

from __future__ import annotations

import socket
import threading
import time

from conftest import Bridge, Replica, free_port, metric, wait_for
from prefixlog_client import IndexClient
from test_vllm_bridge import BS, MODEL, answer, engine_spec, expect_equal, toks, until_subscribed
from vllm_engine import Engine, Request

# The bridge's resident memory may grow by less than one frame at the cap while under attack.
RSS_GROWTH = 64 << 20
FRAME_CAP = 64 << 20  # the bridge's default --max-frame-bytes

GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\0") + b"\0" + bytes(31)


def command(name: bytes, data: bytes) -> bytes:
    body = bytes([len(name)]) + name + data
    assert len(body) < 256
    return bytes([0x04, len(body)]) + body


def ready(socket_type: bytes) -> bytes:
    return command(b"READY", bytes([11]) + b"Socket-Type" + len(socket_type).to_bytes(4, "big") + socket_type)


def long_header(flags: int, size: int) -> bytes:
    return bytes([flags | 0x02]) + size.to_bytes(8, "big")


def read_exact(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def read_frame(conn: socket.socket) -> bytes:
    flags = read_exact(conn, 1)[0]
    size = int.from_bytes(read_exact(conn, 8 if flags & 0x02 else 1), "big")
    return read_exact(conn, size)


def handshake(conn: socket.socket, socket_type: bytes = b"PUB"):
    """The binding side's greeting and NULL handshake: the client's greeting and READY read."""
    conn.sendall(GREETING)
    greeting = read_exact(conn, 64)
    assert greeting[0] == 0xFF and greeting[10] == 3, greeting
    assert read_frame(conn).startswith(b"\x05READY")
    conn.sendall(ready(socket_type))


def hold(conn: socket.socket):
    """Keeps the connection open, reading nothing, until the bridge closes it (or 120 s)."""
    conn.settimeout(120)
    try:
        while conn.recv(1 << 16):
            pass
    except OSError:
        pass


def huge_frame(conn):
    handshake(conn)
    conn.sendall(long_header(0, 1 << 62))
    hold(conn)


def garbage(conn):
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    hold(conn)


def huge_command(conn):
    handshake(conn)
    conn.sendall(long_header(0x04, 1 << 40))
    hold(conn)


def endless_more(conn):
    handshake(conn)
    conn.settimeout(120)
    while True:
        conn.sendall(b"\x01\x00" * 4096)  # fails once the bridge has closed the connection


def stall(conn):
    handshake(conn)
    conn.sendall(long_header(0, FRAME_CAP - 1) + bytes(1024))
    time.sleep(120)  # reads nothing: the bridge's PINGs go unanswered


def replay_huge_frame(conn):
    handshake(conn, b"ROUTER")
    read_frame(conn), read_frame(conn)  # the DEALER's request: delimiter, start seq
    conn.sendall(long_header(0, 1 << 62))
    hold(conn)


class Hostile:
    """A loopback listener running `attack` on every connection, each in its own thread."""

    def __init__(self, attack):
        self.attack, self.port, self.connections = attack, free_port(), 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn):
        try:
            self.attack(conn)
        except OSError:
            pass  # the bridge dropped the connection, as it should
        finally:
            conn.close()

    def close(self):
        self.sock.close()


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_hostile_endpoints_leave_the_bridge_and_real_feeds_running(processes):
    replica = Replica()
    processes.append(replica)
    e1 = Engine(free_port(), free_port(), BS)
    e2 = Engine(free_port(), free_port(), BS)
    attacks = {11: huge_frame, 12: garbage, 13: huge_command, 14: endless_more, 15: stall}
    hostile = {w: Hostile(a) for w, a in attacks.items()}
    bad_replay = Hostile(replay_huge_frame)
    try:
        specs = [engine_spec(1, e1), f"endpoint=tcp://127.0.0.1:{e2.port},replay=tcp://127.0.0.1:{bad_replay.port},worker=2"]
        specs += [f"endpoint=tcp://127.0.0.1:{h.port},worker={w}" for w, h in hostile.items()]
        bridge = Bridge(replica, MODEL, BS, specs, extra=["--heartbeat-interval", "1s", "--heartbeat-timeout", "2s"])
        processes.append(bridge)
        until_subscribed(bridge, {1: e1, 2: e2})
        client = IndexClient([replica.grpc], deadline=5.0)
        baseline = rss(bridge.proc.pid)
        peak = [baseline]

        def alive_and_bounded():
            assert bridge.alive(), f"the bridge exited with {bridge.proc.returncode}"
            peak[0] = max(peak[0], rss(bridge.proc.pid))
            assert peak[0] - baseline < RSS_GROWTH, f"RSS {baseline} -> {peak[0]} bytes"

        step = iter(range(10**6))

        def traffic(n=2):
            """Real requests on both engines: engine 1's half share a first block, engine 2's
            are all new (after its reset, a block stored before it is unknown to the bridge)."""
            made = []
            for _ in range(n):
                i = next(step)
                shared = toks(100_000, 16) + toks(100_016 + 1000 * i, 32)
                for e, r in ((e1, Request(shared if i % 2 else toks(200_000 + 1000 * i, 48))),
                             (e2, Request(toks(500_000 + 1000 * i, 48)))):
                    e.run(r)
                    made.append((e, r))
            alive_and_bounded()
            return made

        def checks(made):
            return [(1 if e is e1 else 2, r.query(), (), 0, e.hit_depth(r)) for e, r in made]

        before = traffic(3)
        expect_equal(client, checks(before), "before the attacks land")

        # Every hostile connection ends for its reason, again on reconnection; real traffic
        # flows meanwhile.
        reasons = {11: "oversized", 12: "protocol", 13: "oversized", 14: "oversized", 15: "timeout"}
        during = []

        def all_dropped_twice():
            during.extend(traffic(1))
            text = bridge.metrics()
            return all(metric(text, "prefixlog_bridge_disconnects_total", worker=w, reason=r) >= 2 for w, r in reasons.items())

        wait_for("every hostile endpoint dropped twice, each for its reason", all_dropped_twice, 90, 0.5)
        text = bridge.metrics()
        skipped = {w: metric(text, "prefixlog_bridge_messages_skipped_total", worker=w, reason="oversized") for w in (11, 13, 14)}
        assert skipped[11] >= 2 and skipped[14] >= 2 and skipped[13] == 0, f"a frame or message over a cap is a skipped message, a command is not: {skipped}"
        for w in reasons:
            assert hostile[w].connections >= 2 and metric(text, "prefixlog_bridge_reconnects_total", worker=w) >= 2
            assert metric(text, "prefixlog_bridge_messages_received_total", worker=w) == 0
        expect_equal(client, checks(before + during[-40:]), "while the attacks go on")

        # Engine 2 loses a message: its replay socket is the hostile ROUTER, so the replay is
        # oversized, and the worker starts over (a new epoch) at the next message. Nothing lost
        # is credited; what follows is held.
        seq = e2.flush()
        e2.drop = lambda s: s == seq
        lost = Request(toks(900_000, 48))
        e2.run(lost)
        e2.flush()
        e2.drop = lambda s: False
        resets = metric(bridge.metrics(), "prefixlog_bridge_resets_total", worker=2, reason="gap")
        after = traffic(3)
        wait_for(
            "engine 2's gap: an oversized replay, then a reset",
            lambda: metric(bridge.metrics(), "prefixlog_bridge_resets_total", worker=2, reason="gap") > resets,
            60,
            0.3,
        )
        text = bridge.metrics()
        assert metric(text, "prefixlog_bridge_replays_total", worker=2, outcome="oversized") >= 1
        assert metric(text, "prefixlog_bridge_replays_total", worker=2, outcome="ok") == 0
        e1_checks = checks([m for m in before + during[-40:] + after if m[0] is e1])
        e2_after = checks([m for m in after if m[0] is e2])
        expect_equal(client, e1_checks + e2_after, "after engine 2's reset")
        assert e2.hit_depth(lost) == 3 and answer(client, 2, lost.query()) == 0, "the lost store is not credited"
        # The real engines' connections were never dropped: libzmq answers the bridge's PINGs.
        text = bridge.metrics()
        assert metric(text, "prefixlog_bridge_disconnects_total", worker=1) == 0
        assert metric(text, "prefixlog_bridge_disconnects_total", worker=2) == 0
        alive_and_bounded()
        print(f"bridge RSS: {baseline >> 20} MiB before the attacks, peak {peak[0] >> 20} MiB")
    finally:
        for h in [*hostile.values(), bad_replay]:
            h.close()
        e1.stop()
        e2.stop()

"""Fixtures of the upstream leg: prefixlog processes (a replica with its embedded broker, bridges)
started from the binary `run.sh` builds, and the project's own Python client to ask them.

Every process is started on free loopback ports and killed at the end of its test; its log is
printed when the test fails (pytest shows captured output of failed tests only).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "python"))  # prefixlog_client, from the checkout
sys.path.insert(0, str(ROOT / "scripts"))

from free_ports import free_port  # noqa: E402,F401  (the legs' tests take it from here)


def prefixlog_bin() -> str:
    path = os.environ.get("PREFIXLOG_BIN")
    if not path:
        target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache/prefixlog/target"))
        path = f"{target}/debug/prefixlog"
    if not os.access(path, os.X_OK):
        pytest.fail(f"prefixlog binary not found at {path}: run tests/upstream/run.sh (it builds it)")
    return path


def wait_for(what: str, check, timeout: float = 60.0, interval: float = 0.05):
    """Polls `check()` until it returns a truthy value (returned) or `timeout` passes (fails)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # a server still starting refuses connections
            last = e
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Process:
    """A prefixlog child process with its log in a temporary file."""

    def __init__(self, name: str, args: list[str]):
        self.name = name
        self.log_path = tempfile.mktemp(prefix=f"prefixlog-upstream-{name}-", suffix=".log")
        self._log = open(self.log_path, "wb")
        self.args = [prefixlog_bin(), *args]
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int | None = None):
        if self.alive():
            if sig is None:
                self.proc.terminate()
            else:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def dump(self):
        print(f"----- {self.name} log ({' '.join(self.args)}) -----\n{self.log()}")


class Replica(Process):
    """`prefixlog serve`: with `brokers=None` it starts its embedded broker (reachable over TCP
    by bridges and other replicas: `self.brokers`)."""

    def __init__(self, name="replica", brokers: str | None = None, partitions: int = 4, extra=()):
        self.grpc_port, self.admin_port = free_port(), free_port()
        self.partitions = partitions
        args = ["serve", "--partitions", str(partitions), "--tick-interval", "0", "--ready-lag", "0",
                "--replica-id", name, "--grpc-addr", f"127.0.0.1:{self.grpc_port}",
                "--admin-addr", f"127.0.0.1:{self.admin_port}", "--peer-addr", f"127.0.0.1:{free_port()}"]
        if brokers:
            args += ["--brokers", brokers]
        super().__init__(name, [*args, *extra])
        self.brokers = brokers or wait_for(f"{name}'s embedded broker", self._embedded_broker, 60)
        wait_for(f"{name} ready", self.ready, 60)

    def _embedded_broker(self):
        if not self.alive():
            self.dump()
            pytest.fail(f"{self.name} exited with {self.proc.returncode}")
        m = re.search(r"bootstrap=([0-9.:]+)", self.log())
        return m.group(1) if m else None

    def ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/readyz", timeout=2) as r:
            return r.status == 200

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=5) as r:
            return r.read().decode()

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


class Bridge(Process):
    """`prefixlog bridge` for engines given as `--engine` specs (`endpoint=...,worker=...,...`)."""

    def __init__(self, replica: Replica, model: str, block_size: int, engines: list[str], extra=(),
                 name="bridge"):
        self.admin_port = free_port()
        args = ["bridge", "--brokers", replica.brokers, "--partitions", str(replica.partitions),
                "--model", model, "--block-size", str(block_size), "--admin-addr",
                f"127.0.0.1:{self.admin_port}", "--metrics-interval", "0s"]
        for e in engines:
            args += ["--engine", e]
        super().__init__(name, [*args, *extra])

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=5) as r:
            return r.read().decode()


def metric(text: str, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == str(v) for k, v in labels.items()):
            total += float(m.group(3))
    return total


@pytest.fixture
def processes(request):
    """Collects processes a test starts; stops them after it and dumps their logs if it failed."""
    started: list[Process] = []
    yield started
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    for p in reversed(started):
        p.stop()
        if failed:
            p.dump()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_report_header(config):
    import upstream_loader

    ran = ", ".join(f"{n} {v}" for n, v in upstream_loader.pins().items())
    return f"upstream leg pins: {ran}"

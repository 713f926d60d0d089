"""`pip install` of the package into a fresh virtualenv -- no dev extra, no grpcio-tools, no
stubs generated, nothing from the repository but python/'s files -- gives a client that queries
a live replica, sync and asyncio. Slow-ish (pip downloads or reuses grpcio, protobuf, xxhash):
runs only against the replica run_tests.sh starts."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from prefixlog_client import IndexClient

from test_live import ADDR, full_chain_answer, last_chain

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
pytestmark = pytest.mark.skipif(not ADDR, reason="PREFIXLOG_GRPC not set (run python/run_tests.sh)")

# Run by the fresh venv's interpreter, outside the repository: argv = endpoint, chain (JSON).
QUERY_BOTH_CLIENTS = r"""
import asyncio, importlib.metadata, importlib.resources, importlib.util, json, sys
import prefixlog_client
from prefixlog_client import AsyncIndexClient, IndexClient

endpoint, chain = sys.argv[1], json.loads(sys.argv[2])
KS = ("trace", 64, 1)

def summary(r):
    return {"outcome": r.outcome, "reason": r.reason, "depth": r.scores[0].depth if r.scores else 0}

async def query_async():
    async with AsyncIndexClient([endpoint], deadline=5.0) as c:
        return summary(await c.match(KS, hashes=chain))

with IndexClient([endpoint], deadline=5.0) as c:
    sync_result = summary(c.match(KS, hashes=chain))
print(json.dumps({
    "module": prefixlog_client.__file__,
    "sync": sync_result,
    "asyncio": asyncio.run(query_async()),
    "grpc_tools": importlib.util.find_spec("grpc_tools") is not None,
    "py_typed": importlib.resources.files("prefixlog_client").joinpath("py.typed").is_file(),
    "protobuf": importlib.metadata.version("protobuf"),
    "grpcio": importlib.metadata.version("grpcio"),
}))
"""


def source_copy(dest):
    """python/'s package files alone, as a clean checkout has them (no build/ left over from an
    earlier build, whose stale files setuptools would put into the wheel; no ../proto)."""
    junk = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
    os.makedirs(dest)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(PYTHON_DIR, name), dest)
    shutil.copytree(os.path.join(PYTHON_DIR, "prefixlog_client"), os.path.join(dest, "prefixlog_client"), ignore=junk)
    return dest


def test_fresh_venv_install_queries_a_live_replica(tmp_path):
    chain = last_chain()
    with IndexClient([ADDR], deadline=5.0) as c:
        full_chain_answer(c, chain)  # the replica has it all: the fresh venv's answers must be full
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    src = source_copy(str(tmp_path / "python"))
    pip = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", src],
        capture_output=True, text=True, timeout=900,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    run = subprocess.run(
        # -W error: a protobuf gencode/runtime version warning (a UserWarning) fails the import.
        [py, "-W", "error::UserWarning", "-c", QUERY_BOTH_CLIENTS, ADDR, json.dumps(chain)],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    print(f"fresh venv: protobuf {got['protobuf']}, grpcio {got['grpcio']}")
    assert got["module"].startswith(str(venv)), got["module"]  # the installed copy, not the source
    assert not got["grpc_tools"] and got["py_typed"]
    for kind in ("sync", "asyncio"):
        assert got[kind] == {"outcome": "scores", "reason": "", "depth": len(chain)}, (kind, got)

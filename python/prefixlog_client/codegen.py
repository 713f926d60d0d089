"""Regenerates the committed gRPC stubs in prefixlog_client/_proto from the repository's protos.

    python -m prefixlog_client.codegen [--check] [--proto-dir DIR]

Run it from python/ (so that the source tree, not an installed copy, is the package) after
changing anything in proto/proto. `--check` regenerates into a temporary directory and exits 1
with "stubs are stale" when the result differs from the committed files (python/run_tests.sh
runs it through tests/test_codegen.py).

The stubs are committed so that `pip install` needs neither grpcio-tools nor the protos. Two
post-processing rules make them a package: grpcio-tools writes `import records_pb2` (the protos
import each other by bare file name), which is rewritten to `from . import records_pb2`; and
only protos that declare services get a `_pb2_grpc` module. The output depends on the
grpcio-tools version (its protoc stamps the protobuf gencode version, its plugin the minimum
grpcio), so the version is pinned here and in pyproject.toml's dev extra.
"""
import argparse
import os
import re
import sys
import tempfile
from typing import Dict, List, Optional

GRPCIO_TOOLS_VERSION = "1.75.1"  # gencode needs protobuf >= 6.31.1, grpcio >= 1.75.1
PROTOS = ("records.proto", "query.proto", "peer.proto")
SERVICE_PROTOS = ("query.proto", "peer.proto")
STALE_HINT = "stubs are stale: run `python -m prefixlog_client.codegen`"

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
STUBS_DIR = os.path.join(PACKAGE_DIR, "_proto")
DEFAULT_PROTO_DIR = os.path.join(PACKAGE_DIR, "..", "..", "proto", "proto")

_MODULES = "|".join(re.escape(p[: -len(".proto")]) for p in PROTOS)
# `import query_pb2 as query__pb2` (in .py and .pyi), for the stubs' own modules only.
_SIBLING_IMPORT = re.compile(r"^import ((?:%s)_pb2) as (\w+)$" % _MODULES, re.MULTILINE)
_ANY_TOP_LEVEL_PB2_IMPORT = re.compile(r"^import \w+_pb2\b", re.MULTILINE)


def relative_imports(source: str) -> str:
    """Rewrites the generated sibling imports to package-relative ones, so the modules import as
    part of the package wherever it is installed."""
    rewritten = _SIBLING_IMPORT.sub(r"from . import \1 as \2", source)
    leftover = _ANY_TOP_LEVEL_PB2_IMPORT.search(rewritten)
    if leftover:
        raise RuntimeError(f"unexpected top-level stub import left in generated code: {leftover.group(0)!r}")
    return rewritten


def _protoc(args: List[str]) -> None:
    from grpc_tools import protoc  # dev dependency: grpcio-tools

    if protoc.main(["protoc"] + args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


def _check_tools_version() -> None:
    from importlib.metadata import version

    have = version("grpcio-tools")
    if have != GRPCIO_TOOLS_VERSION:
        raise RuntimeError(
            f"grpcio-tools {have} is installed but the committed stubs come from {GRPCIO_TOOLS_VERSION} "
            f"(pip install 'grpcio-tools=={GRPCIO_TOOLS_VERSION}', or the package's [dev] extra)"
        )


def render(proto_dir: str = DEFAULT_PROTO_DIR) -> Dict[str, str]:
    """The stub modules for `proto_dir`, by file name, with package-relative imports."""
    _check_tools_version()
    proto_dir = os.path.abspath(proto_dir)
    with tempfile.TemporaryDirectory(prefix="prefixlog-codegen-") as out:
        paths = [os.path.join(proto_dir, p) for p in PROTOS]
        _protoc([f"-I{proto_dir}", f"--python_out={out}", f"--pyi_out={out}"] + paths)
        services = [os.path.join(proto_dir, p) for p in SERVICE_PROTOS]
        _protoc([f"-I{proto_dir}", f"--grpc_python_out={out}"] + services)
        rendered = {}
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name), encoding="utf-8") as f:
                rendered[name] = relative_imports(f.read())
    return rendered


def committed(stubs_dir: str = STUBS_DIR) -> Dict[str, str]:
    """The generated modules currently in `stubs_dir` (everything but the hand-written __init__)."""
    stubs = {}
    for name in sorted(os.listdir(stubs_dir)):
        if re.fullmatch(r"\w+_pb2(_grpc)?\.pyi?", name):
            with open(os.path.join(stubs_dir, name), encoding="utf-8") as f:
                stubs[name] = f.read()
    return stubs


def stale_files(proto_dir: str = DEFAULT_PROTO_DIR, stubs_dir: str = STUBS_DIR) -> List[str]:
    """File names that differ between a fresh generation and `stubs_dir` (missing, extra or
    changed); empty when the committed stubs are current."""
    fresh, have = render(proto_dir), committed(stubs_dir)
    return sorted(n for n in set(fresh) | set(have) if fresh.get(n) != have.get(n))


def write(proto_dir: str = DEFAULT_PROTO_DIR, stubs_dir: str = STUBS_DIR) -> List[str]:
    """Replaces the generated modules in `stubs_dir` with a fresh generation; returns their names."""
    fresh = render(proto_dir)
    for name in set(committed(stubs_dir)) - set(fresh):
        os.remove(os.path.join(stubs_dir, name))
    for name, text in fresh.items():
        with open(os.path.join(stubs_dir, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    return sorted(fresh)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m prefixlog_client.codegen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed stubs differ from a fresh generation")
    ap.add_argument("--proto-dir", default=DEFAULT_PROTO_DIR, help="directory of records/query/peer.proto")
    ap.add_argument("--stubs-dir", default=STUBS_DIR, help=argparse.SUPPRESS)  # tests point it at a copy
    args = ap.parse_args(argv)
    if args.check:
        stale = stale_files(args.proto_dir, args.stubs_dir)
        if stale:
            print(f"{STALE_HINT} (differs: {', '.join(stale)})", file=sys.stderr)
            return 1
        print(f"stubs are current ({args.stubs_dir})")
        return 0
    for name in write(args.proto_dir, args.stubs_dir):
        print(os.path.join(args.stubs_dir, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())

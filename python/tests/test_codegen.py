"""The committed stubs (prefixlog_client/_proto) are what codegen makes from proto/proto, and
they are a proper package: relative imports, no sys.path changes."""
import os
import re
import shutil
import subprocess
import sys

import pytest

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SOURCE_PACKAGE = os.path.join(PYTHON_DIR, "prefixlog_client")
STUBS = os.path.join(SOURCE_PACKAGE, "_proto")


def codegen(*args):
    """`python -m prefixlog_client.codegen ARGS` on the source tree (cwd python/ puts it first
    on sys.path), as a developer runs it."""
    return subprocess.run(
        [sys.executable, "-m", "prefixlog_client.codegen", *args],
        cwd=PYTHON_DIR, capture_output=True, text=True, timeout=120,
    )


def test_relative_import_rewrite():
    from prefixlog_client.codegen import relative_imports

    src = "import grpc\nimport records_pb2 as records__pb2\nfrom google.protobuf import descriptor as _d\n"
    want = "import grpc\nfrom . import records_pb2 as records__pb2\nfrom google.protobuf import descriptor as _d\n"
    assert relative_imports(src) == want
    with pytest.raises(RuntimeError):
        relative_imports("import other_pb2 as other__pb2\n")  # a proto codegen does not know


def test_package_never_touches_sys_path():
    for root, _, files in os.walk(SOURCE_PACKAGE):
        for name in files:
            if name.endswith((".py", ".pyi")):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    text = f.read()
                assert not re.search(r"sys\.path\s*(\.(insert|append|extend)|\[|\+?=)", text), name
                assert not re.search(r"^import \w+_pb2", text, re.MULTILINE), name


def test_committed_stubs_are_current():
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the [dev] extra) regenerates the stubs")
    r = codegen("--check")
    assert r.returncode == 0, r.stderr


def test_the_check_fails_on_a_changed_stub(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the [dev] extra) regenerates the stubs")
    copy = tmp_path / "_proto"
    shutil.copytree(STUBS, copy)
    with open(copy / "query_pb2.py", "a") as f:
        f.write("# edited by hand\n")
    (copy / "peer_pb2_grpc.py").unlink()
    r = codegen("--check", "--stubs-dir", str(copy))
    assert r.returncode == 1
    assert "stubs are stale: run `python -m prefixlog_client.codegen`" in r.stderr
    assert "peer_pb2_grpc.py" in r.stderr and "query_pb2.py" in r.stderr


def test_the_check_fails_after_a_proto_change(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the [dev] extra) regenerates the stubs")
    protos = tmp_path / "proto"
    shutil.copytree(os.path.join(PYTHON_DIR, "..", "proto", "proto"), protos)
    query = (protos / "query.proto").read_text()
    added = query.replace("bool exclude_gapped = 11;", "bool exclude_gapped = 11;\n  bool added = 99;")
    (protos / "query.proto").write_text(added)
    r = codegen("--check", "--proto-dir", str(protos))
    assert r.returncode == 1 and "query_pb2.py" in r.stderr, r.stderr

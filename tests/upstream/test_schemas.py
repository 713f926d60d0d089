"""Every facade's protobuf schema (`proto/proto/compat/`) against the one a pinned package
publishes: names, numbers, types, labels, oneofs, enum values and services must be equal, so a
field our copy lacks or numbers differently fails here (schema_compare.py says what is compared).

Ours: compiled by grpcio-tools' protoc (`--descriptor_set_out`, with its bundled well-known
types). Published: the descriptors compiled into the pinned package's `_pb2` modules (xds-protos
ships Envoy's protos as generated Python only, no .proto files).

A schema with no published counterpart in any registry package is listed in UNPUBLISHED with
where it was looked for; a test fails as soon as a pinned package ships it, so that the
comparison is added then (docs/compat/README.md, "Schemas checked against the published ones").
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2 as d

import upstream_loader
from schema_compare import Omissions, compare

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "proto/proto/compat"

# Our file -> (pinned distribution, module whose DESCRIPTOR is the published file).
PUBLISHED = {
    "envoy/service/ext_proc/v3/external_processor.proto":
        ("xds-protos", "envoy.service.ext_proc.v3.external_processor_pb2"),
    "envoy/config/core/v3/base.proto": ("xds-protos", "envoy.config.core.v3.base_pb2"),
    "envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto":
        ("xds-protos", "envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2"),
    "envoy/type/v3/http_status.proto": ("xds-protos", "envoy.type.v3.http_status_pb2"),
}


@dataclass(frozen=True)
class Unpublished:
    """A schema no registry package publishes; `dists` are the pinned packages that would
    (the peers that speak it), searched for the service's gRPC path and the file."""

    service: str
    dists: tuple[str, ...]
    why: str


UNPUBLISHED = {
    "sglang/kv_indexer.proto": Unpublished(
        "kv_indexer.v1.KVIndexer", ("sglang", "sglang-router"),
        "experimental/sgl-router/sgl-kv-indexer is `publish = false` (not on the Rust "
        "registry); no sglang or sglang-router wheel ships the .proto, a _pb2 module or a client "
        "of the service"),
    "smg/radix_index.proto": Unpublished(
        "radix_index.RadixIndex", ("smg",),
        "crates/radix_index announces the crate `smg-radix-index`, which the Rust registry "
        "does not have; the smg wheel (smg_rs) has no radix-index client or descriptor"),
}

# What our copies leave out of the published files, each with why the picker is right without
# it. The Envoy copy reproduces only the types ext_proc's messages use from base.proto.
_BASE_UNUSED = (
    "a base.proto type no ext_proc message refers to; the picker never sees it on the wire")
OMISSIONS = {
    "envoy/config/core/v3/base.proto": Omissions({
        **{("message", f"envoy.config.core.v3.{m}"): _BASE_UNUSED for m in (
            "Locality", "BuildVersion", "Extension", "Node", "RuntimeUInt32", "RuntimePercent",
            "RuntimeDouble", "RuntimeFeatureFlag", "KeyValue", "KeyValuePair", "KeyValueAppend",
            "KeyValueMutation", "QueryParameter", "WatchedDirectory", "DataSource",
            "RetryPolicy", "RemoteDataSource", "AsyncDataSource", "TransportSocket",
            "RuntimeFractionalPercent", "ControlPlane")},
        **{("enum", f"envoy.config.core.v3.{e}"): _BASE_UNUSED
           for e in ("RoutingPriority", "RequestMethod", "TrafficDirection")},
    }),
}


def _well_known_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def compile_ours(files: list[str]) -> dict[str, d.FileDescriptorProto]:
    """Our files compiled with protoc (grpcio-tools), by file name."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ours.pb"
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{COMPAT}",
               f"-I{_well_known_include()}", f"--descriptor_set_out={out}", *files]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"protoc failed on our schemas:\n{r.stderr}"
        fds = d.FileDescriptorSet.FromString(out.read_bytes())
    return {f.name: f for f in fds.file}


def published(module: str) -> d.FileDescriptorProto:
    serialized = importlib.import_module(module).DESCRIPTOR.serialized_pb
    return d.FileDescriptorProto.FromString(serialized)


def our_files() -> list[str]:
    return sorted(str(p.relative_to(COMPAT)) for p in COMPAT.rglob("*.proto"))


@pytest.fixture(scope="module")
def ours() -> dict[str, d.FileDescriptorProto]:
    return compile_ours(our_files())


def test_every_schema_is_checked_or_listed_as_unpublished():
    files = set(our_files())
    unclassified = files - PUBLISHED.keys() - UNPUBLISHED.keys()
    assert not unclassified, (
        f"schemas with no published counterpart named: {sorted(unclassified)}; add each to "
        "PUBLISHED (pinned package and module) or to UNPUBLISHED (where it was looked for)")
    gone = (PUBLISHED.keys() | UNPUBLISHED.keys()) - files
    assert not gone, f"listed but not in proto/proto/compat: {sorted(gone)}"
    assert set(OMISSIONS) <= PUBLISHED.keys()


@pytest.mark.parametrize("dist", sorted({dist for dist, _ in PUBLISHED.values()}))
def test_the_installed_package_is_the_pinned_one(dist):
    assert importlib.metadata.version(dist) == upstream_loader.pins()[dist], (
        f"{dist} installed is not the version in pins.txt: rebuild the venv (venv.sh)")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_schema_matches_the_published_one(ours, name):
    dist, module = PUBLISHED[name]
    pub = published(module)
    assert pub.name == name, f"{module} declares {pub.name}, not {name}"
    report = compare(ours[name], pub, OMISSIONS.get(name))
    if report.failures:
        pytest.fail(f"our {name} differs from {dist} {upstream_loader.pins()[dist]} ({module}):\n"
                    + report.text(), pytrace=False)


def _descriptor_with(msg: str, field: str, **change) -> d.FileDescriptorProto:
    """external_processor.proto as published, with one field of one message changed."""
    fd = published(PUBLISHED["envoy/service/ext_proc/v3/external_processor.proto"][1])
    m = next(m for m in fd.message_type if m.name == msg)
    f = next(f for f in m.field if f.name == field)
    if change.pop("remove", False):
        m.field.remove(f)
    for k, v in change.items():
        setattr(f, k, v)
    return fd


def test_the_comparison_fails_on_a_missing_renumbered_or_retyped_field():
    name = "envoy/service/ext_proc/v3/external_processor.proto"
    pub = published(PUBLISHED[name][1])
    assert not compare(pub, pub).failures, "a file differs from itself"

    missing = compare(_descriptor_with("HttpBody", "grpc_message_compressed", remove=True), pub)
    assert missing.failures == [
        "- missing field envoy.service.ext_proc.v3.HttpBody.grpc_message_compressed: "
        "singular bool = 4"], missing.text()

    renumbered = compare(_descriptor_with("ProcessingResponse", "request_drain", number=12), pub)
    assert renumbered.failures == [
        "~ changed field envoy.service.ext_proc.v3.ProcessingResponse.request_drain: "
        "ours singular bool = 12, published singular bool = 11"], renumbered.text()

    string = d.FieldDescriptorProto.TYPE_STRING
    retyped = compare(_descriptor_with("ImmediateResponse", "body", type=string), pub)
    assert [f.split(":")[0] for f in retyped.failures] == [
        "~ changed field envoy.service.ext_proc.v3.ImmediateResponse.body"], retyped.text()


def test_an_allowed_omission_passes_and_a_stale_one_fails():
    name = "envoy/service/ext_proc/v3/external_processor.proto"
    pub = published(PUBLISHED[name][1])
    ours = _descriptor_with("HttpBody", "grpc_message_compressed", remove=True)
    key = ("field", "envoy.service.ext_proc.v3.HttpBody.grpc_message_compressed")
    assert not compare(ours, pub, Omissions({key: "test"})).failures
    stale = compare(pub, pub, Omissions({key: "test"}))
    assert len(stale.failures) == 1 and stale.failures[0].startswith("! stale"), stale.text()


def _shipped_in(dist: str, service: str, basename: str) -> list[str]:
    """Where a pinned package carries a schema: a file of that name, or the service's gRPC
    path (`/pkg.Service/`, in a client's or server's code, compiled or not)."""
    needle = f"/{service}/".encode()
    found = []
    for path in _package_files(dist):
        if path.name == basename:
            found.append(str(path))
        elif path.suffix in (".py", ".so") and path.stat().st_size < 1 << 30:
            if needle in path.read_bytes():
                found.append(f"{path} (contains {needle.decode()})")
    return found


def _package_files(dist: str) -> list[Path]:
    """An installed distribution's files, or a `# source` wheel's unpacked files and the
    names in the wheel itself."""
    try:
        return [Path(f.locate()) for f in importlib.metadata.distribution(dist).files or ()]
    except importlib.metadata.PackageNotFoundError:
        pass
    src = upstream_loader.source_dir(dist)
    files = [p for p in src.rglob("*") if p.is_file()]
    cache = src.parent.parent / "wheels"
    for wheel in cache.glob(f"{dist.replace('-', '_')}-{upstream_loader.pins()[dist]}-*.whl"):
        with zipfile.ZipFile(wheel) as z:
            files += [src / n for n in z.namelist() if n.endswith(".proto") and (src / n).exists()]
            missing = [n for n in z.namelist() if n.endswith(".proto") and not (src / n).exists()]
            assert not missing, f"{wheel} has .proto files venv.sh did not unpack: {missing}"
    return files


@pytest.mark.parametrize("name", sorted(UNPUBLISHED))
def test_unpublished_schemas_are_still_unpublished(name):
    u = UNPUBLISHED[name]
    for dist in u.dists:
        assert dist in upstream_loader.pins(), f"{dist} is not pinned in pins.txt"
        found = _shipped_in(dist, u.service, Path(name).name)
        assert not found, (
            f"{dist} {upstream_loader.pins()[dist]} now ships {u.service} ({name}): compare "
            f"our copy with it (move it from UNPUBLISHED to PUBLISHED): {found}")
    assert os.path.exists(COMPAT / name)

"""SGLang's `kv_indexer.v1.KVIndexer` on a live replica (run_tests.sh starts `prefixlog serve
--sgl-model sgl-test --sgl-block-size 2`), called through stubs generated here from the
upstream schema (proto/proto/compat/sglang/kv_indexer.proto) with grpcio-tools -- not through
prefixlog's own client.

PREFIXLOG_SGLANG_GRPC = the replica's query port, which hosts the facade.
"""
import hashlib
import importlib
import os
import pathlib
import subprocess
import sys
import time

import grpc
import pytest

ADDR = os.environ.get("PREFIXLOG_SGLANG_GRPC")
ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not ADDR, reason="PREFIXLOG_SGLANG_GRPC not set (run python/run_tests.sh)")


def page_hashes(tokens, page):
    """SGLang's page hash chain as docs/compat/sglang.md describes it: SHA-256 over the prior
    page's digest (none for the first page) and each token as 4 bytes little-endian; the wire
    value is the digest's first 8 bytes, big-endian, as a signed 64-bit integer."""
    out, prior = [], b""
    for i in range(0, len(tokens) - len(tokens) % page, page):
        d = hashlib.sha256(prior + b"".join(t.to_bytes(4, "little") for t in tokens[i : i + page])).digest()
        out.append(int.from_bytes(d[:8], "big", signed=True))
        prior = d
    return out


# The goldens of docs/compat/sglang.md (sgl-router's kv_events::hash).
GOLDEN = [978178666101069530, -895308556211281782, -8033692805846017938, 835415944263129316]


def test_the_documented_goldens_are_sglangs_page_hashes():
    assert page_hashes([1, 2, 3, 4], 4) == [-3488128144981237669]
    assert page_hashes([10, 20, 30, 40, 50, 60, 70, 80], 2) == GOLDEN


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    out = tmp_path_factory.mktemp("sgl_stubs")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "proto/proto/compat"),
         f"--python_out={out}", f"--grpc_python_out={out}", "sglang/kv_indexer.proto"],
        check=True,
    )
    sys.path.insert(0, str(out))
    try:
        pb2 = importlib.import_module("sglang.kv_indexer_pb2")
        grpc_pb2 = importlib.import_module("sglang.kv_indexer_pb2_grpc")
    finally:
        sys.path.remove(str(out))
    return pb2, grpc_pb2


def serving(channel):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stub = health_pb2_grpc.HealthStub(channel)
    end = time.monotonic() + 60
    while True:
        try:
            r = stub.Check(health_pb2.HealthCheckRequest(service="kv_indexer.v1.KVIndexer"), timeout=2)
            if r.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        assert time.monotonic() < end, "kv_indexer.v1.KVIndexer never reported SERVING"
        time.sleep(0.1)


def test_reflection_lists_the_facade():
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    db = ProtoReflectionDescriptorDatabase(grpc.insecure_channel(ADDR))
    assert "kv_indexer.v1.KVIndexer" in db.get_services()
    assert db.FindFileContainingSymbol("kv_indexer.v1.MatchExternalKvPrefixRequest").name == "sglang/kv_indexer.proto"


def test_router_query_sees_the_bridges_batches(stubs):
    pb2, grpc_pb2 = stubs
    channel = grpc.insecure_channel(ADDR)
    serving(channel)
    kv = grpc_pb2.KVIndexerStub(channel)
    chain = page_hashes([10, 20, 30, 40, 50, 60, 70, 80], 2)
    hbm, dram = pb2.TierType.Value("TIER_HBM"), pb2.TierType.Value("TIER_DRAM")
    report = pb2.ExternalKvActionType.Value("ACTION_REPORT")

    def apply(worker, seq, actions):
        kv.ApplyExternalKvBatch(
            pb2.ApplyExternalKvBatchRequest(
                worker_id=worker, seq=seq, actions=actions, worker_address=f"http://{worker}:30000"
            ),
            timeout=20,
        )

    apply("py-sgl-0", 1, [pb2.ExternalKvAction(type=report, tier=hbm, hashes=chain[:3])])
    apply("py-sgl-1", 1, [pb2.ExternalKvAction(type=report, tier=hbm, hashes=chain[:1])])
    # Line B: continuing a chain names the parent of the first hash.
    apply("py-sgl-1", 2, [pb2.ExternalKvAction(type=report, tier=hbm, hashes=chain[1:2], parent_block_hash=chain[0])])
    # A host-tier (DRAM) copy counts: a prefix match counts a block held on any tier.
    apply("py-sgl-2", 1, [pb2.ExternalKvAction(type=report, tier=dram, hashes=chain[:2])])

    r = kv.MatchExternalKvPrefix(pb2.MatchExternalKvPrefixRequest(hashes=chain), timeout=20)
    got = [(m.worker_address, m.matched_prefix_blocks, m.worker_id) for m in r.matches]
    assert got == [
        ("http://py-sgl-0:30000", 3, "py-sgl-0"),
        ("http://py-sgl-1:30000", 2, "py-sgl-1"),
        ("http://py-sgl-2:30000", 2, "py-sgl-2"),
    ]
    assert (r.best_prefix_blocks, r.blocks_read) == (3, 4)
    capped = kv.MatchExternalKvPrefix(pb2.MatchExternalKvPrefixRequest(hashes=chain, max_blocks=1), timeout=20)
    assert [(m.worker_id, m.matched_prefix_blocks) for m in capped.matches] == [
        ("py-sgl-0", 1),
        ("py-sgl-1", 1),
        ("py-sgl-2", 1),
    ]

    revoke = pb2.ExternalKvActionType.Value("ACTION_REVOKE")
    apply("py-sgl-0", 2, [pb2.ExternalKvAction(type=revoke, tier=hbm, hashes=chain[1:2])])
    # Revoked on DRAM: the host copy of the second block is gone.
    apply("py-sgl-2", 2, [pb2.ExternalKvAction(type=revoke, tier=dram, hashes=chain[1:2])])
    r = kv.MatchExternalKvPrefix(pb2.MatchExternalKvPrefixRequest(hashes=chain), timeout=20)
    assert [(m.worker_id, m.matched_prefix_blocks) for m in r.matches] == [
        ("py-sgl-1", 2),
        ("py-sgl-0", 1),
        ("py-sgl-2", 1),
    ]
    held = kv.MatchExternalKv(pb2.MatchExternalKvRequest(hashes=chain), timeout=20)
    tiers = {m.worker_id: [(t.tier, list(t.hashes)) for t in m.hashes_by_tier] for m in held.matches}
    assert tiers["py-sgl-2"] == [(dram, chain[:1])]
    # The hole left by the revoke is listed as one: which hashes, not a prefix.
    assert tiers["py-sgl-0"] == [(hbm, [chain[0], chain[2]])]

    with pytest.raises(grpc.RpcError) as e:
        kv.ApplyExternalKvBatch(pb2.ApplyExternalKvBatchRequest(worker_id=""), timeout=20)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT

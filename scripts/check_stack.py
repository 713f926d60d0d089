"""Checks a running two-replica stack (scripts/check-stack.sh starts deploy/compose.local.yml).

    python check_stack.py --a GRPC,ADMIN,PEER --b GRPC,ADMIN,PEER --records N --trace FILE --stretch S \
        --certs DIR [--shards S0A S0B S1A S1B]   (each GRPC,ADMIN,PEER: the `sharded` profile's 2 shards x 2 replicas)

The query and peer ports run mutual TLS (scripts/make-certs.sh's certificates in DIR): every
gRPC call here presents client.pem and trusts ca.pem, and a call without a client certificate
must be refused (checked once, on replica-a's query and peer ports).

1. both replicas ready (/readyz 200) with every replayed record applied or skipped (/metrics);
2. both answer the trace's last request (its chain is resident: nothing evicts after it) through
   the Python client (prefixlog_client.IndexClient) with a full-depth match, and the same scores;
3. their anti-entropy digests agree: ReplicaPeer/Digests on each peer port, every digest point
   both hold (equal next_offset in a partition) has the same digest, same settings fingerprint;
4. neither replica's anti-entropy has counted a mismatch;
5. with --shards: every shard replica ready, together having applied every replayed record; the
   Python client, discovering the layout from the four shard replicas, answers with exactly
   replica-a's scores and no partial flag; each shard's two replicas agree digest for digest,
   and each agrees with the unsharded replica-a at every point both hold.
Needs prefixlog_client (python/, with its committed stubs) on sys.path (the shell script sets
that up).
"""
import argparse
import json
import sys
import time
import urllib.request

import grpc

from prefixlog_client import IndexClient
from prefixlog_client._proto import peer_pb2, peer_pb2_grpc

M = (1 << 64) - 1
TLS = {}  # IndexClient's TLS arguments (main() fills them from --certs)


def pem(certs, name):
    with open(f"{certs}/{name}", "rb") as f:
        return f.read()


def secure(port):
    """A mutual-TLS channel to a local port (the certificates name 127.0.0.1)."""
    creds = grpc.ssl_channel_credentials(TLS["root_certificates"], TLS["private_key"], TLS["certificate_chain"])
    return grpc.secure_channel(f"127.0.0.1:{port}", creds)
KS = ("trace", 64, 1)  # the replay's keyspace (prefixlog/src/fleet_records.rs)


def mix64(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M
    return x ^ (x >> 33)


def last_chain(trace, stretch):
    """Local hashes of the trace's last request, copy 0 (workload/src/trace.rs expand_request)."""
    last = None
    with open(trace) as f:
        for line in f:
            if line.strip():
                last = json.loads(line)
    return [mix64(mix64(((i * 0x100) & M) ^ j)) for i in last["hash_ids"] for j in range(max(stretch, 1))]


def metrics(admin):
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        base = name.split("{", 1)[0]
        out[base] = out.get(base, 0.0) + float(value)
    return out


def wait_ready(name, admins, records, timeout):
    """Waits until every replica in `admins` is ready and together they have applied or skipped
    `records` (one replica of the whole log, or one replica of each shard)."""
    end = time.monotonic() + timeout
    n, last = 0.0, "never polled"
    while time.monotonic() < end:
        try:
            counts = [metrics(a) for a in admins]
            n = sum(m.get("prefixlog_records_applied_total", 0) + m.get("prefixlog_records_skipped_total", 0)
                    for m in counts)
            if n >= records and all(
                urllib.request.urlopen(f"http://127.0.0.1:{a}/readyz", timeout=5).status == 200 for a in admins
            ):
                print(f"{name}: ready, {n:.0f} records applied or skipped (replayed: {records})")
                return
            last = f"{n:.0f} of {records} records"
        except OSError as e:  # URLError (also a 503 from /readyz), a reset connection
            last = str(e)
        time.sleep(0.2)
    sys.exit(f"{name} (admin ports {admins}) not ready within {timeout}s: {last}")


def answer(client, chain, timeout=60):
    """Polls until some worker matches the whole chain; returns that answer."""
    end = time.monotonic() + timeout
    r = None
    while time.monotonic() < end:
        r = client.match(KS, hashes=chain, deadline=2.0)
        if r.outcome == "scores" and r.scores[0].depth == len(chain):
            return r
        time.sleep(0.2)
    top = f", top depth {r.scores[0].depth} (worker {r.scores[0].worker})" if r and r.scores else ""
    sys.exit(f"no full-depth answer for the last request's {len(chain)} blocks within {timeout}s: "
             f"outcome {r.outcome if r else None} {r.reason if r else ''}{top}")


def digests(peer):
    with secure(peer) as ch:
        return peer_pb2_grpc.ReplicaPeerStub(ch).Digests(peer_pb2.DigestsRequest(), timeout=10)


def refuses_without_client_certificate(name, grpc_port, peer_port):
    """mTLS: with only the CA (no client certificate) the handshake is refused on both ports,
    and plaintext is not spoken."""
    c = IndexClient([f"127.0.0.1:{grpc_port}"], deadline=2.0, root_certificates=TLS["root_certificates"])
    r = c.match(KS, hashes=[1], deadline=2.0)
    c.close()
    if r.outcome != "unavailable":
        sys.exit(f"{name}: the query port answered a client without a certificate: {r}")
    creds = grpc.ssl_channel_credentials(TLS["root_certificates"])
    for port, what in ((peer_port, "peer"),):
        for ch in (grpc.secure_channel(f"127.0.0.1:{port}", creds), grpc.insecure_channel(f"127.0.0.1:{port}")):
            try:
                peer_pb2_grpc.ReplicaPeerStub(ch).Digests(peer_pb2.DigestsRequest(), timeout=5)
                sys.exit(f"{name}: the {what} port answered a client without a certificate")
            except grpc.RpcError:
                pass
            finally:
                ch.close()
    print(f"{name}: query and peer ports refuse clients without a certificate (mutual TLS)")


def compare_digests(na, da, nb, db, same_partitions=True):
    """Every digest point both replicas hold (equal next_offset in a partition both own) must be
    equal; returns how many were compared. `same_partitions`: they must own the same ones."""
    # (settings_fingerprint and cluster_id: in peer.proto since the proto revision of 2026-11-30)
    for field in ("topic", "partition_count", "settings_fingerprint", "cluster_id"):
        if field in da.DESCRIPTOR.fields_by_name and getattr(da, field) != getattr(db, field):
            sys.exit(f"Digests of {na} and {nb} differ in {field}: {getattr(da, field)!r} vs {getattr(db, field)!r}")
    pa = {p.partition: p for p in da.partitions}
    pb = {p.partition: p for p in db.partitions}
    if (same_partitions and set(pa) != set(pb)) or not pa or not set(pa) & set(pb):
        sys.exit(f"{na} and {nb} own partitions {sorted(pa)} and {sorted(pb)}")
    compared, mismatched, partitions_compared = 0, [], 0
    for part in sorted(set(pa) & set(pb)):
        xa = {pt.next_offset: pt.digest for pt in pa[part].points}
        xb = {pt.next_offset: pt.digest for pt in pb[part].points}
        common = sorted(set(xa) & set(xb))
        partitions_compared += bool(common)
        for off in common:
            compared += 1
            if xa[off] != xb[off]:
                mismatched.append((part, off, hex(xa[off]), hex(xb[off])))
    print(f"digests {na} / {nb}: {compared} points compared in {partitions_compared} of "
          f"{len(set(pa) & set(pb))} partitions")
    if mismatched:
        sys.exit(f"digest mismatches {na} / {nb} (partition, next_offset, {na}, {nb}): {mismatched}")
    if compared == 0:
        sys.exit(f"no digest point held by both {na} and {nb}: nothing compared")
    return compared


def check_shards(shards, records, chain, want, unsharded_digests, timeout):
    """The `sharded` profile: 2 shards x 2 replicas of the same log (see the module doc, 5)."""
    names = ["shard0-a", "shard0-b", "shard1-a", "shard1-b"]
    reps = dict(zip(names, shards))
    wait_ready("shard0-a + shard1-a", [reps["shard0-a"][1], reps["shard1-a"][1]], records, timeout)
    wait_ready("shard0-b + shard1-b", [reps["shard0-b"][1], reps["shard1-b"][1]], records, timeout)
    c = IndexClient([f"127.0.0.1:{g}" for g, _, _ in shards], discover=True, deadline=2.0, **TLS)
    end = time.monotonic() + 60
    got = None
    while time.monotonic() < end:
        r = c.match(KS, hashes=chain, deadline=2.0)
        got = [(s.worker, s.dp_rank, s.lane, s.depth) for s in r.scores] if r.outcome == "scores" else r.reason
        if got == want and not r.partial:
            break
        time.sleep(0.2)
    c.close()
    if got != want or r.partial:
        sys.exit(f"the sharded answer differs from replica-a's (partial={r.partial}): {got} vs {want}")
    print(f"2 shards x 2 replicas, fanned out by the Python client: the same {len(want)} scores as replica-a")
    d = {name: digests(peer) for name, (_, _, peer) in reps.items()}
    for shard in ("shard0", "shard1"):
        compare_digests(f"{shard}-a", d[f"{shard}-a"], f"{shard}-b", d[f"{shard}-b"])
        compare_digests(f"{shard}-a", d[f"{shard}-a"], "replica-a", unsharded_digests, same_partitions=False)
    for name, (_, admin, _) in reps.items():
        mm = metrics(admin).get("prefixlog_anti_entropy_mismatches_total", 0)
        if mm:
            sys.exit(f"{name}'s anti-entropy found {mm:.0f} mismatches")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="replica-a's GRPC,ADMIN,PEER ports")
    ap.add_argument("--b", required=True, help="replica-b's GRPC,ADMIN,PEER ports")
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--stretch", type=int, default=8)
    ap.add_argument("--shards", nargs=4, metavar="GRPC,ADMIN,PEER",
                    help="the sharded profile's shard0-a shard0-b shard1-a shard1-b ports")
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--certs", required=True, help="scripts/make-certs.sh's directory (ca.pem, client.pem, client.key)")
    a = ap.parse_args()
    TLS.update(root_certificates=pem(a.certs, "ca.pem"), private_key=pem(a.certs, "client.key"),
               certificate_chain=pem(a.certs, "client.pem"))
    reps = {"replica-a": [int(p) for p in a.a.split(",")], "replica-b": [int(p) for p in a.b.split(",")]}

    for name, (_, admin, _) in reps.items():
        wait_ready(name, [admin], a.records, a.timeout)

    chain = last_chain(a.trace, a.stretch)
    answers = {}
    for name, (grpc_port, _, _) in reps.items():
        c = IndexClient([f"127.0.0.1:{grpc_port}"], deadline=2.0, **TLS)
        r = answer(c, chain)
        c.close()
        assert r.replica_id == name, (r.replica_id, name)
        answers[name] = [(s.worker, s.dp_rank, s.lane, s.depth) for s in r.scores]
        print(f"{name}: match of the last request ({len(chain)} blocks): {len(r.scores)} workers, "
              f"top worker {r.scores[0].worker} depth {r.scores[0].depth}")
    if answers["replica-a"] != answers["replica-b"]:
        sys.exit(f"the replicas answer differently: {answers}")
    print("both replicas give the same scores")
    refuses_without_client_certificate("replica-a", reps["replica-a"][0], reps["replica-a"][2])

    d = {name: digests(peer) for name, (_, _, peer) in reps.items()}
    compare_digests("replica-a", d["replica-a"], "replica-b", d["replica-b"])

    for name, (_, admin, _) in reps.items():
        m = metrics(admin)
        mm = m.get("prefixlog_anti_entropy_mismatches_total", 0)
        print(f"{name}: anti-entropy rounds {m.get('prefixlog_anti_entropy_rounds_total', 0):.0f}, "
              f"points compared {m.get('prefixlog_anti_entropy_points_compared_total', 0):.0f}, mismatches {mm:.0f}")
        if mm:
            sys.exit(f"{name}'s anti-entropy found {mm:.0f} mismatches")
    if a.shards:
        shards = [[int(p) for p in s.split(",")] for s in a.shards]
        check_shards(shards, a.records, chain, answers["replica-a"], d["replica-a"], a.timeout)
    print("stack check passed")


if __name__ == "__main__":
    main()

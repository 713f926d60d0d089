"""A fail-open query client: `IndexClient.match()` never raises for index problems.

Outcomes: "scores" (some worker holds a prefix), "empty" (none does), "unavailable" (timeout,
disconnected, overloaded or rejected; `reason` says which) -- a gateway routes without the
index on anything but "scores". Several endpoints are tried in order (the last one that
answered first) within one deadline, each getting its share of what is left.
"""
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import grpc

from . import _gen  # noqa: F401  (puts the generated stubs on sys.path)
import query_pb2  # noqa: E402
import query_pb2_grpc  # noqa: E402
import records_pb2  # noqa: E402


@dataclass
class Score:
    worker: int
    dp_rank: int
    lane: int
    depth: int
    total_blocks: int
    inferred: bool
    intervals: List[Tuple[int, int]] = field(default_factory=list)


@dataclass
class MatchResult:
    outcome: str  # "scores" | "empty" | "unavailable"
    scores: List[Score] = field(default_factory=list)
    applied: List[Tuple[int, int]] = field(default_factory=list)  # (partition, next offset)
    replica_id: str = ""
    stale: bool = False
    reason: str = ""  # for "unavailable": timeout | disconnected | overloaded | rejected: ...
    endpoint: str = ""


_RETRY_NEXT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN}


class IndexClient:
    """Queries replicas with a deadline and fails open (never raises for an unavailable index).

    TLS: pass `root_certificates` (PEM bytes of the CA that signed the replicas' certificate);
    for mutual TLS (`serve --tls-client-ca`) also `private_key` and `certificate_chain` (PEM).
    `server_name` overrides the name checked against the certificate (e.g. when connecting by
    an address the certificate does not list). Without any of them the channel is plaintext.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        deadline: float = 0.002,
        root_certificates: Optional[bytes] = None,
        private_key: Optional[bytes] = None,
        certificate_chain: Optional[bytes] = None,
        server_name: Optional[str] = None,
    ):
        self.deadline = deadline
        if (private_key is None) != (certificate_chain is None):
            raise ValueError("mutual TLS needs both private_key and certificate_chain")
        if root_certificates is None and certificate_chain is None:
            if server_name is not None:
                raise ValueError("server_name only applies to TLS")
            channel = grpc.insecure_channel
        else:
            creds = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
            options = [("grpc.ssl_target_name_override", server_name)] if server_name else []

            def channel(e):
                return grpc.secure_channel(e, creds, options=options)

        self._eps = [(e, channel(e)) for e in endpoints]
        self._stubs = [query_pb2_grpc.PrefixIndexStub(ch) for _, ch in self._eps]
        self._preferred = 0

    def close(self):
        for _, ch in self._eps:
            ch.close()

    def match(
        self,
        keyspace: Tuple[str, int, int],
        tokens: Optional[Sequence[int]] = None,
        hashes: Optional[Sequence[int]] = None,
        top_k: Optional[int] = None,
        lane: Optional[int] = None,
        intervals: bool = False,
        min_offsets: Sequence[Tuple[int, int]] = (),
        allow_stale: bool = False,
        deadline: Optional[float] = None,
        namespace: str = "",
    ) -> MatchResult:
        """`namespace`: for `tokens`, the LoRA adapter (or other namespace) the request runs
        under ("" = base model); `hashes` carry it already (block_hashes(..., namespace))."""
        model, block_size, scheme = keyspace
        req = query_pb2.MatchRequest(
            keyspace=records_pb2.Keyspace(model=model, block_size=block_size, hash_scheme=scheme),
            intervals=intervals,
            allow_stale=allow_stale,
            min_offsets=[records_pb2.PartitionOffset(partition=p, offset=o) for p, o in min_offsets],
        )
        if tokens is not None:
            req.tokens.ids.extend(tokens)
            req.tokens.namespace = namespace
        elif hashes is not None:
            req.hashes.local.extend(hashes)
        if top_k is not None:
            req.top_k = top_k
        if lane is not None:
            req.lane = lane
        end = time.monotonic() + (self.deadline if deadline is None else deadline)
        reason = "disconnected: no endpoints"
        n = len(self._eps)
        for k in range(n):
            i = (self._preferred + k) % n
            left = end - time.monotonic()
            if left <= 0:
                return MatchResult("unavailable", reason="timeout")
            try:
                # What is left, split over the endpoints still to try: a hung replica costs at
                # most its share (same policy as the Rust client).
                r = self._stubs[i].Match(req, timeout=left / (n - k))
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    reason = "timeout"
                    continue
                if code in _RETRY_NEXT:
                    kind = "overloaded" if code == grpc.StatusCode.RESOURCE_EXHAUSTED else "disconnected"
                    reason = f"{kind}: {self._eps[i][0]}: {e.details()}"
                    continue
                return MatchResult("unavailable", reason=f"rejected: {code.name}: {e.details()}")
            except Exception as e:  # fail open on anything else, too
                reason = f"disconnected: {self._eps[i][0]}: {e}"
                continue
            self._preferred = i
            scores = [
                Score(s.worker, s.dp_rank, s.lane, s.depth, s.total_blocks, s.inferred,
                      [(iv.start, iv.end) for iv in s.intervals])
                for s in r.scores
            ]
            return MatchResult(
                "scores" if scores else "empty",
                scores=scores,
                applied=[(o.partition, o.offset) for o in r.applied],
                replica_id=r.replica_id,
                stale=r.stale,
                endpoint=self._eps[i][0],
            )
        return MatchResult("unavailable", reason=reason)


def match(endpoint: str, keyspace, deadline: float = 0.002, **kw) -> MatchResult:
    """One-shot helper: `match("127.0.0.1:50151", ("m", 16, 1), tokens=[...])`."""
    c = IndexClient([endpoint], deadline=deadline)
    try:
        return c.match(keyspace, **kw)
    finally:
        c.close()

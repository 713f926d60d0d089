"""The synchronous fail-open query client: `IndexClient.match()` never raises for index problems.

Outcomes: "scores" (some worker holds a prefix), "empty" (none does), "unavailable" (timeout,
disconnected, overloaded or rejected; `reason` says which) -- a gateway routes without the
index on anything but "scores". Several endpoints are tried in order (the last one that
answered first) within one deadline, each getting its share of what is left.
prefixlog_client.aio.AsyncIndexClient is the same client for asyncio.
"""
from typing import Optional, Sequence

import grpc

from ._proto import query_pb2_grpc
from ._transport import ChannelSecurity, Failover, endpoint_list
from ._wire import Keyspace, MatchResult, match_request, match_result
from .tokens import Token


class IndexClient:
    """Queries replicas with a deadline and fails open (never raises for an unavailable index).

    `endpoints`: "host:port" of replicas of the same log (or shard); `deadline`: seconds per
    query, split over the endpoints. TLS: pass `root_certificates` (PEM bytes of the CA that
    signed the replicas' certificate); for mutual TLS (`serve --tls-client-ca`) also
    `private_key` and `certificate_chain` (PEM). `server_name` overrides the name checked
    against the certificate. Without any of them the channel is plaintext.
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
        security = ChannelSecurity(root_certificates, private_key, certificate_chain, server_name)
        self.deadline = deadline
        self.endpoints = endpoint_list(endpoints)
        self._channels = [security.open(grpc, e) for e in self.endpoints]
        self._stubs = [query_pb2_grpc.PrefixIndexStub(ch) for ch in self._channels]
        self._preferred = 0

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

    def __enter__(self) -> "IndexClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def match(
        self,
        keyspace: Keyspace,
        tokens: Optional[Sequence[int]] = None,
        hashes: Optional[Sequence[int]] = None,
        top_k: Optional[int] = None,
        lane: Optional[int] = None,
        intervals: bool = False,
        min_offsets: Sequence[Token] = (),
        allow_stale: bool = False,
        deadline: Optional[float] = None,
        namespace: str = "",
        candidate_workers: Sequence[int] = (),
        exclude_gapped: bool = False,
    ) -> MatchResult:
        """Which workers hold the longest prefix of the prompt in `keyspace` (model, block
        size, hash scheme). The prompt is `tokens` (token ids, hashed by the replica under
        `namespace`, e.g. a LoRA adapter's name, "" for the base model) or `hashes` (local block
        hashes from block_hashes(), which carry the namespace already).

        `min_offsets`: consistency token in next offsets (prefixlog_client.tokens) -- answer
        only once every record below each offset is applied; pass a previous answer's `applied`
        unchanged, or token_from_ack() of a publish acknowledgement. Not reached within the
        deadline: "unavailable: timeout", or with `allow_stale` an answer flagged `stale`.
        `candidate_workers`: score only these workers; `exclude_gapped`: leave out holders whose
        event stream had a gap. `deadline` overrides the client's for this query.
        """
        req = match_request(
            keyspace, tokens=tokens, hashes=hashes, namespace=namespace, top_k=top_k, lane=lane,
            intervals=intervals, min_offsets=min_offsets, allow_stale=allow_stale,
            candidate_workers=candidate_workers, exclude_gapped=exclude_gapped,
        )
        failover = Failover(self.endpoints, self._preferred, self.deadline if deadline is None else deadline)
        for i, timeout in failover.attempts():
            try:
                resp = self._stubs[i].Match(req, timeout=timeout)
            except Exception as e:  # fail open on anything, grpc.RpcError or not
                final = failover.failed(i, e)
                if final is not None:
                    return final
                continue
            self._preferred = i
            return match_result(resp, self.endpoints[i])
        return failover.unavailable()


def match(endpoint: str, keyspace: Keyspace, deadline: float = 0.002, **kw) -> MatchResult:
    """One-shot helper: `match("127.0.0.1:50151", ("m", 16, 1), tokens=[...])`. Takes
    IndexClient's TLS options and match()'s query arguments."""
    tls = {k: kw.pop(k) for k in ("root_certificates", "private_key", "certificate_chain", "server_name") if k in kw}
    with IndexClient([endpoint], deadline=deadline, **tls) as c:
        return c.match(keyspace, **kw)

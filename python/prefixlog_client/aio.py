"""The asyncio fail-open query client (grpc.aio): IndexClient's semantics for async gateways.

    async with AsyncIndexClient(["10.0.0.5:50151", "10.0.0.6:50151"], deadline=0.002) as c:
        r = await c.match(("my-model", 16, 1), tokens=token_ids)

Same outcomes, reasons, deadline split and failover as prefixlog_client.IndexClient (both build
requests and read answers with the same code). Cancelling the awaiting task cancels the query
(asyncio.CancelledError is not an index problem and is not swallowed).
"""
from typing import List, Optional, Sequence

import grpc
import grpc.aio

from ._proto import query_pb2_grpc
from ._transport import ChannelSecurity, Failover, endpoint_list
from ._wire import Keyspace, MatchResult, match_request, match_result
from .tokens import Token


class AsyncIndexClient:
    """IndexClient for asyncio: same constructor arguments (endpoints, deadline in seconds,
    TLS / mutual TLS options), `await match(...)` with the same arguments and results.

    The channels are opened on the first query, in the running event loop (grpc.aio channels
    belong to one loop), so the client can be constructed anywhere; use it from that loop only.
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
        self._security = ChannelSecurity(root_certificates, private_key, certificate_chain, server_name)
        self.deadline = deadline
        self.endpoints = endpoint_list(endpoints)
        self._channels: List[grpc.aio.Channel] = []
        self._stubs: List[query_pb2_grpc.PrefixIndexStub] = []
        self._preferred = 0

    def _open(self) -> None:
        if not self._channels:
            self._channels = [self._security.open(grpc.aio, e) for e in self.endpoints]
            self._stubs = [query_pb2_grpc.PrefixIndexStub(ch) for ch in self._channels]

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], []
        for ch in channels:
            await ch.close()

    async def __aenter__(self) -> "AsyncIndexClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def match(
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
        """See IndexClient.match: the same arguments (`min_offsets` in next offsets, e.g. a
        previous answer's `applied` unchanged) and the same fail-open outcomes."""
        req = match_request(
            keyspace, tokens=tokens, hashes=hashes, namespace=namespace, top_k=top_k, lane=lane,
            intervals=intervals, min_offsets=min_offsets, allow_stale=allow_stale,
            candidate_workers=candidate_workers, exclude_gapped=exclude_gapped,
        )
        self._open()
        failover = Failover(self.endpoints, self._preferred, self.deadline if deadline is None else deadline)
        for i, timeout in failover.attempts():
            try:
                resp = await self._stubs[i].Match(req, timeout=timeout)
            except Exception as e:  # fail open on anything; CancelledError is no Exception
                final = failover.failed(i, e)
                if final is not None:
                    return final
                continue
            self._preferred = i
            return match_result(resp, self.endpoints[i])
        return failover.unavailable()

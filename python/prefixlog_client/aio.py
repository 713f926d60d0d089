"""The asyncio fail-open query client (grpc.aio): IndexClient's semantics for async gateways.

    async with AsyncIndexClient(["10.0.0.5:50151", "10.0.0.6:50151"], deadline=0.002) as c:
        r = await c.match(("my-model", 16, 1), tokens=token_ids)

Same outcomes, reasons, deadline split, failover and sharded fan-out as
prefixlog_client.IndexClient (both build requests, plan the fan-out and merge answers with the
same code). Cancelling the awaiting task cancels the query (asyncio.CancelledError is not an
index problem and is not swallowed).
"""
import asyncio
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import grpc
import grpc.aio

from ._proto import query_pb2, query_pb2_grpc
from ._shards import (
    NO_MAP,
    Refresh,
    Shard,
    ShardSpec,
    as_worker_list,
    build_map,
    described,
    fan_out_calls,
    in_map_order,
    mark_coverage,
    merge_matches,
    merge_workers,
    plan,
    shard_failed,
)
from ._seeds import Resolver, expand, system_resolver
from ._transport import ChannelSecurity, Failover
from ._wire import Keyspace, MatchResult, WorkerList, match_request, match_result, worker_list
from .mux import AsyncStreamMux
from .tokens import Token

Result = Union[MatchResult, WorkerList]


class AsyncIndexClient:
    """IndexClient for asyncio: same constructor arguments (endpoints, deadline in seconds,
    TLS / mutual TLS options, `shards=` or `discover=True` with its `resolver`), `await match(...)` and `await
    list_workers()` with the same arguments and results.

    The channels are opened on the first query, in the running event loop (grpc.aio channels
    belong to one loop), so the client can be constructed anywhere; use it from that loop only.
    With `discover=True` the shard map is built on entering `async with` (or by the first
    query, which then waits for it: up to `discovery_timeout`), and refreshed in the
    background as IndexClient's is.
    """

    def __init__(
        self,
        endpoints: Sequence[str] = (),
        deadline: float = 0.002,
        root_certificates: Optional[bytes] = None,
        private_key: Optional[bytes] = None,
        certificate_chain: Optional[bytes] = None,
        server_name: Optional[str] = None,
        *,
        shards: Optional[ShardSpec] = None,
        discover: bool = False,
        refresh_interval: float = 30.0,
        discovery_timeout: float = 1.0,
        resolver: Optional[Resolver] = None,
        streaming: bool = False,
    ):
        self._security = ChannelSecurity(root_certificates, private_key, certificate_chain, server_name)
        # Match over one long-lived MatchStream per replica (prefixlog_client.mux).
        self._streaming = streaming
        self._muxes: Dict[str, AsyncStreamMux] = {}
        self.deadline = deadline
        self.endpoints, self._map = plan(endpoints, shards, discover)
        self._resolver = resolver or system_resolver
        self._opened = False
        self._channels: Dict[str, grpc.aio.Channel] = {}
        self._stubs: Dict[str, query_pb2_grpc.PrefixIndexStub] = {}
        self._discover = discover
        self._discovered = False
        self._first_discovery: Optional[asyncio.Future] = None
        self.discovery_timeout = discovery_timeout
        self._refresh = Refresh(refresh_interval)
        self._refresh_task: Optional[asyncio.Task] = None
        self.protocol_anomalies = 0  # workers reported by two shards, over the client's life

    def _open(self) -> None:
        """Opens the channels of the given endpoints (a static map) in the running loop."""
        if not self._opened:
            self._opened = True
            if not self._discover:
                for e in self.endpoints:
                    self._stub(e)

    def _stub(self, endpoint: str, seed_name: Optional[str] = None) -> query_pb2_grpc.PrefixIndexStub:
        """The stub of `endpoint`, its channel opened on first use (discovery adds endpoints:
        the addresses the seeds resolve to)."""
        stub = self._stubs.get(endpoint)
        if stub is None:
            channel = self._security.open(grpc.aio, endpoint, seed_name)
            self._channels[endpoint] = channel
            stub = self._stubs[endpoint] = query_pb2_grpc.PrefixIndexStub(channel)
        return stub

    def _mux(self, endpoint: str) -> AsyncStreamMux:
        mux = self._muxes.get(endpoint)
        if mux is None:
            self._stub(endpoint)
            mux = self._muxes[endpoint] = AsyncStreamMux(self._channels[endpoint])
        return mux

    async def _ready(self) -> None:
        self._open()
        if self._discover and not self._discovered:
            # Queries arriving together all wait for the one first discovery.
            if self._first_discovery is None:
                self._first_discovery = asyncio.ensure_future(self.refresh())
            await asyncio.shield(self._first_discovery)

    async def close(self) -> None:
        pending = [t for t in (self._refresh_task, self._first_discovery) if t is not None and not t.done()]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)  # let them end before the loop does
        muxes, self._muxes = self._muxes, {}
        for mux in muxes.values():
            await mux.close()
        channels, self._channels, self._stubs = self._channels, {}, {}
        for ch in channels.values():
            await ch.close()

    async def __aenter__(self) -> "AsyncIndexClient":
        await self._ready()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def shards(self) -> List[Shard]:
        """The shard map in use (copies): key, endpoints, partitions (None until known)."""
        smap = self._map
        return [Shard(s.key, list(s.endpoints), s.partitions, s.preferred) for s in smap.shards] if smap else []

    async def refresh(self) -> bool:
        """Resolves the seeds, asks every address `Describe` now and rebuilds the shard map
        (discover=True). False when no endpoint answered (the map is kept)."""
        self._open()
        self._refresh.start()
        req = query_pb2.DescribeRequest()

        async def ask(e: str, seed_name: Optional[str]):
            try:
                stub = self._stub(e, seed_name)
                return described(e, await stub.Describe(req, timeout=self.discovery_timeout), None)
            except Exception as err:  # a down replica is simply not in the map
                return described(e, None, err)

        try:
            # getaddrinfo blocks: off the event loop.
            seeds = await asyncio.get_running_loop().run_in_executor(None, expand, self.endpoints, self._resolver)
            asks = (ask(e, seeds.server_names.get(e)) for e in seeds.endpoints)
            found = [d for d in await asyncio.gather(*asks) if d is not None]
            smap = build_map(found, seeds.endpoints, self._map)
            if smap is not None:
                self._map = smap
            return smap is not None
        finally:
            self._discovered = True
            self._refresh.done()

    def _maybe_refresh(self, results: Sequence[Tuple[Shard, Result]] = ()) -> None:
        """Starts a background refresh of a discovered map when one is due."""
        if not self._discover:
            return
        if shard_failed(results) or self._map is None:
            self._refresh.wanted = True
        if self._refresh.due():
            self._refresh.running = True
            self._refresh_task = asyncio.get_running_loop().create_task(self.refresh())

    async def _call(self, shard: Shard, method: str, req, end: float, read: Callable) -> Result:
        """One RPC to a shard: its replicas in turn (the last that answered first) until `end`."""
        failover = Failover(shard.endpoints, shard.preferred, 0, end=end)
        for i, timeout in failover.attempts():
            endpoint = shard.endpoints[i]
            try:
                if self._streaming and method == "Match":
                    resp = await self._mux(endpoint).ask(req, timeout)
                else:
                    resp = await getattr(self._stub(endpoint), method)(req, timeout=timeout)
            except Exception as e:  # fail open on anything; CancelledError is no Exception
                final = failover.failed(i, e)
                if final is not None:
                    return final
                continue
            shard.preferred = i
            return read(resp, endpoint)
        return failover.unavailable()

    async def _fan_out(self, calls: Sequence[Tuple[Shard, object]], method: str, end: float, read: Callable) -> List[Tuple[Shard, Result]]:
        """`_call` on every shard at once, all until `end`; a shard still waiting then is a
        timeout."""
        tasks = [asyncio.ensure_future(self._call(shard, method, req, end, read)) for shard, req in calls]
        try:
            if tasks:
                await asyncio.wait(tasks, timeout=max(end - time.monotonic(), 0))
        finally:
            for t in tasks:
                t.cancel()  # no-op on finished ones; ends the late ones (and all, if we were cancelled)
        return [
            (shard, t.result() if t.done() and not t.cancelled() else MatchResult("unavailable", reason="timeout"))
            for (shard, _), t in zip(calls, tasks)
        ]

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
        tiers: Sequence = (),
        tier_weights: Optional[Dict] = None,
        cache_salt: str = "",
        extra: Sequence[Tuple[int, Sequence[str]]] = (),
        mm_inputs: Sequence[Tuple[str, int, int]] = (),
        lookahead: int = 0,
    ) -> MatchResult:
        """See IndexClient.match: the same arguments (`min_offsets` in next offsets, e.g. a
        previous answer's `applied` unchanged) and the same fail-open outcomes, sharded or not."""
        req = match_request(
            keyspace, tokens=tokens, hashes=hashes, namespace=namespace, top_k=top_k, lane=lane,
            intervals=intervals, min_offsets=min_offsets, allow_stale=allow_stale,
            candidate_workers=candidate_workers, exclude_gapped=exclude_gapped,
            tiers=tiers, tier_weights=tier_weights,
            cache_salt=cache_salt, extra=extra, mm_inputs=mm_inputs, lookahead=lookahead,
        )
        await self._ready()
        end = time.monotonic() + (self.deadline if deadline is None else deadline)
        smap = self._map
        if smap is None:
            self._maybe_refresh()
            return MatchResult("unavailable", reason=NO_MAP)
        if len(smap.shards) == 1:
            shard = smap.shards[0]
            r = await self._call(shard, "Match", req, end, match_result)
            self._maybe_refresh([(shard, r)])
            return mark_coverage(smap, shard, r)
        calls, preset = fan_out_calls(smap, req)
        results = in_map_order(smap, await self._fan_out(calls, "Match", end, match_result), preset)
        self._maybe_refresh(results)
        merged = merge_matches(smap, results, top_k)
        self.protocol_anomalies += merged.anomalies
        return merged

    async def list_workers(self, deadline: float = 1.0) -> WorkerList:
        """See IndexClient.list_workers."""
        await self._ready()
        smap = self._map
        if smap is None:
            self._maybe_refresh()
            return WorkerList("unavailable", reason=NO_MAP)
        end = time.monotonic() + deadline
        req = query_pb2.ListWorkersRequest()
        got = await self._fan_out([(s, req) for s in smap.shards], "ListWorkers", end, lambda resp, _e: worker_list(resp))
        results = [(s, as_worker_list(r)) for s, r in got]
        self._maybe_refresh(results)
        return merge_workers(smap, results)

"""The synchronous fail-open query client: `IndexClient.match()` never raises for index problems.

Outcomes: "scores" (some worker holds a prefix), "empty" (none does), "unavailable" (timeout,
disconnected, overloaded or rejected; `reason` says which) -- a gateway routes without the
index on anything but "scores". Several endpoints are tried in order (the last one that
answered first) within one deadline, each getting its share of what is left.

Sharded logs (`serve --shard I/N`): give a shard map (`shards=`) or let the client discover it
(`discover=True`); one Match per shard goes out in parallel under the query's deadline and the
answers are merged (prefixlog_client._shards). prefixlog_client.aio.AsyncIndexClient is the
same client for asyncio.
"""
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import grpc

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
from .mux import StreamMux
from .tokens import Token

Result = Union[MatchResult, WorkerList]


class IndexClient:
    """Queries replicas with a deadline and fails open (never raises for an unavailable index).

    `endpoints`: "host:port" of replicas of the same log (or shard); `deadline`: seconds per
    query, split over the endpoints. TLS: pass `root_certificates` (PEM bytes of the CA that
    signed the replicas' certificate); for mutual TLS (`serve --tls-client-ca`) also
    `private_key` and `certificate_chain` (PEM). `server_name` overrides the name checked
    against the certificate. Without any of them the channel is plaintext.

    Sharded logs, either of:
      * `shards={"a": ["10.0.0.5:50151", "10.0.0.6:50151"], "b": [...]}` (or a list of
        endpoint lists): a static map, one entry per shard, its replicas as endpoints;
      * `discover=True`: `endpoints` are seeds: "host:port" of replicas, or of a name that stands
        for many (a headless Kubernetes Service). Every address each seed's host resolves to
        (`resolver(host, port)`, the system's by default) is asked `Describe` now (up to
        `discovery_timeout` seconds) and those reporting the same partitions form a shard;
        with TLS, a resolved address's certificate is checked against the seed's host name.
        The seeds are resolved and asked again in the background every `refresh_interval`
        seconds, and at most every second after a query found a shard with no replica
        answering.
    With one shard (no `shards=`, no `discover=`), queries go to it directly, as they always
    did.

    `streaming=True`: Match queries go over one long-lived MatchStream per replica
    (prefixlog_client.mux.StreamMux) instead of unary calls: cheaper per query for the
    replica; same outcomes, deadlines and failover.
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
        self._muxes: Dict[str, StreamMux] = {}
        self._pool: Optional[ThreadPoolExecutor] = None
        self.deadline = deadline
        self.endpoints, self._map = plan(endpoints, shards, discover)
        self._resolver = resolver or system_resolver
        self._channels = {}
        self._stubs = {}
        self._closed = False
        if not discover:
            for e in self.endpoints:
                self._stub(e)
        self._discover = discover
        self.discovery_timeout = discovery_timeout
        self._refresh = Refresh(refresh_interval)
        self._lock = threading.Lock()
        self.protocol_anomalies = 0  # workers reported by two shards, over the client's life
        if discover:
            self.refresh()

    def _stub(self, endpoint: str, seed_name: Optional[str] = None) -> query_pb2_grpc.PrefixIndexStub:
        """The stub of `endpoint`, its channel opened on first use (discovery adds endpoints:
        the addresses the seeds resolve to)."""
        stub = self._stubs.get(endpoint)
        if stub is None:
            if self._closed:
                raise ValueError("the client is closed")
            channel = self._security.open(grpc, endpoint, seed_name)
            self._channels[endpoint] = channel
            stub = self._stubs[endpoint] = query_pb2_grpc.PrefixIndexStub(channel)
        return stub

    def _mux(self, endpoint: str) -> StreamMux:
        mux = self._muxes.get(endpoint)
        if mux is None:
            self._stub(endpoint)
            mux = self._muxes.setdefault(endpoint, StreamMux(self._channels[endpoint]))
        return mux

    def close(self) -> None:
        self._closed = True
        for mux in list(self._muxes.values()):
            mux.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for ch in list(self._channels.values()):
            ch.close()

    def __enter__(self) -> "IndexClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def shards(self) -> List[Shard]:
        """The shard map in use (copies): key, endpoints, partitions (None until known)."""
        smap = self._map
        return [Shard(s.key, list(s.endpoints), s.partitions, s.preferred) for s in smap.shards] if smap else []

    def refresh(self) -> bool:
        """Resolves the seeds, asks every address `Describe` now and rebuilds the shard map
        from the answers (discover=True). False when no endpoint answered (the map is kept)."""
        with self._lock:
            self._refresh.start()
        try:
            req = query_pb2.DescribeRequest()
            seeds = expand(self.endpoints, self._resolver)
            futures = []
            for e in seeds.endpoints:
                try:
                    stub = self._stub(e, seeds.server_names.get(e))
                    futures.append((e, stub.Describe.future(req, timeout=self.discovery_timeout)))
                except Exception:  # a closed client (a background refresh racing close())
                    continue
            found = []
            for e, f in futures:
                try:
                    d = described(e, f.result(), None)
                except Exception as err:  # a down replica is simply not in the map
                    d = described(e, None, err)
                if d is not None:
                    found.append(d)
            smap = build_map(found, seeds.endpoints, self._map)
            if smap is not None:
                self._map = smap
            return smap is not None
        finally:
            with self._lock:
                self._refresh.done()

    def _maybe_refresh(self, results: Sequence[Tuple[Shard, Result]] = ()) -> None:
        """Starts a background refresh of a discovered map when one is due."""
        if not self._discover:
            return
        with self._lock:
            if shard_failed(results) or self._map is None:
                self._refresh.wanted = True
            if not self._refresh.due():
                return
            self._refresh.running = True  # claimed here; refresh() takes it from there
        threading.Thread(target=self.refresh, name="prefixlog-refresh", daemon=True).start()

    def _call(self, shard: Shard, method: str, req, end: float, read: Callable) -> Result:
        """One RPC to a shard: its replicas in turn (the last that answered first) until `end`."""
        failover = Failover(shard.endpoints, shard.preferred, 0, end=end)
        for i, timeout in failover.attempts():
            endpoint = shard.endpoints[i]
            try:
                if self._streaming and method == "Match":
                    resp = self._mux(endpoint).ask(req, timeout)
                else:
                    resp = getattr(self._stub(endpoint), method)(req, timeout=timeout)
            except Exception as e:  # fail open on anything, grpc.RpcError or not
                final = failover.failed(i, e)
                if final is not None:
                    return final
                continue
            shard.preferred = i
            return read(resp, endpoint)
        return failover.unavailable()

    def _fan_out(self, calls: Sequence[Tuple[Shard, object]], method: str, end: float, read: Callable) -> List[Tuple[Shard, Result]]:
        """`_call` on every shard at once (gRPC futures, no threads of ours): each shard's
        replicas in turn, all until `end`; a shard still waiting then is a timeout. Streaming
        Match: `_call` per shard on a thread of a small pool (each ends by `end`)."""
        if self._streaming and method == "Match":
            if self._pool is None:
                self._pool = ThreadPoolExecutor(thread_name_prefix="prefixlog-shards")
            futures = [self._pool.submit(self._call, shard, method, req, end, read) for shard, req in calls]
            return [(shard, f.result()) for (shard, _), f in zip(calls, futures)]
        results: List[Optional[Result]] = [None] * len(calls)
        walks = [Failover(shard.endpoints, shard.preferred, 0, end=end) for shard, _ in calls]
        attempts = [w.attempts() for w in walks]
        done: "queue.SimpleQueue" = queue.SimpleQueue()
        inflight = {}

        def start(k: int) -> None:
            shard, req = calls[k]
            for i, timeout in attempts[k]:
                try:
                    future = getattr(self._stub(shard.endpoints[i]), method).future(req, timeout=timeout)
                except Exception as e:
                    final = walks[k].failed(i, e)
                    if final is not None:
                        results[k] = final
                        return
                    continue
                inflight[k] = future
                future.add_done_callback(lambda f, k=k, i=i: done.put((k, i, f)))
                return
            results[k] = walks[k].unavailable()

        for k in range(len(calls)):
            start(k)
        while inflight:
            try:
                k, i, future = done.get(timeout=max(end - time.monotonic(), 0))
            except queue.Empty:
                break
            del inflight[k]
            shard = calls[k][0]
            try:
                resp = future.result()
            except Exception as e:
                final = walks[k].failed(i, e)
                if final is not None:
                    results[k] = final
                else:
                    start(k)
                continue
            shard.preferred = i
            results[k] = read(resp, shard.endpoints[i])
        for k, future in inflight.items():
            future.cancel()
            results[k] = MatchResult("unavailable", reason="timeout")
        return [(shard, r) for (shard, _), r in zip(calls, results)]

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
        tiers: Sequence = (),
        tier_weights: Optional[Dict] = None,
        cache_salt: str = "",
        extra: Sequence[Tuple[int, Sequence[str]]] = (),
        mm_inputs: Sequence[Tuple[str, int, int]] = (),
        lookahead: int = 0,
    ) -> MatchResult:
        """Which workers hold the longest prefix of the prompt in `keyspace` (model, block
        size, hash scheme). The prompt is `tokens` (token ids, hashed by the replica under
        `namespace`, e.g. a LoRA adapter's name, "" for the base model) or `hashes` (local block
        hashes from block_hashes(), which carry the namespace already). A token prompt run with
        vLLM's `cache_salt`, or with multimodal inputs, names them too: `cache_salt`, and `extra`
        as (block index, [identifier, ...]) for every block an input's tokens overlap (older
        vLLM), or, for vLLM >= 0.34 which keys blocks by each input's offset too, `mm_inputs` as
        (identifier, offset, length) of each input's placeholder tokens in the prompt. A vLLM
        run with a hash lookahead (speculative decoding) names it: `lookahead`.

        `min_offsets`: consistency token in next offsets (prefixlog_client.tokens) -- answer
        only once every record below each offset is applied; pass a previous answer's `applied`
        unchanged, or token_from_ack() of a publish acknowledgement. Not reached within the
        deadline: "unavailable: timeout", or with `allow_stale` an answer flagged `stale`.
        `candidate_workers`: score only these workers; `exclude_gapped`: leave out holders whose
        event stream had a gap. `deadline` overrides the client's for this query. `tiers`: the
        storage tiers that count, in preference order (e.g. ["gpu", "host"]; empty: all);
        `tier_weights`: {tier: per mille}, scores ordered by `weighted_score` (Score.runs says
        which tier holds which stretch).

        Sharded: every shard is asked in parallel within the one deadline (each gets only its
        partitions' tokens and candidates) and the answers merged, `top_k` after the merge. A
        shard that does not answer makes the result `partial` (`missing_shards`,
        `missing_partitions`) with the other shards' scores; none answering is "unavailable".
        """
        req = match_request(
            keyspace, tokens=tokens, hashes=hashes, namespace=namespace, top_k=top_k, lane=lane,
            intervals=intervals, min_offsets=min_offsets, allow_stale=allow_stale,
            candidate_workers=candidate_workers, exclude_gapped=exclude_gapped,
            tiers=tiers, tier_weights=tier_weights,
            cache_salt=cache_salt, extra=extra, mm_inputs=mm_inputs, lookahead=lookahead,
        )
        end = time.monotonic() + (self.deadline if deadline is None else deadline)
        smap = self._map
        if smap is None:
            self._maybe_refresh()
            return MatchResult("unavailable", reason=NO_MAP)
        if len(smap.shards) == 1:
            shard = smap.shards[0]
            r = self._call(shard, "Match", req, end, match_result)
            self._maybe_refresh([(shard, r)])
            return mark_coverage(smap, shard, r)
        calls, preset = fan_out_calls(smap, req)
        results = in_map_order(smap, self._fan_out(calls, "Match", end, match_result), preset)
        self._maybe_refresh(results)
        merged = merge_matches(smap, results, top_k)
        if merged.anomalies:
            with self._lock:
                self.protocol_anomalies += merged.anomalies
        return merged

    def list_workers(self, deadline: float = 1.0) -> WorkerList:
        """The workers announced by WorkerAdded records (with their metadata, e.g. endpoint and
        model), from every shard, ascending by worker id. Never raises: "unavailable" when no
        shard answered within `deadline` seconds, `partial` when some did not."""
        smap = self._map
        if smap is None:
            self._maybe_refresh()
            return WorkerList("unavailable", reason=NO_MAP)
        end = time.monotonic() + deadline
        req = query_pb2.ListWorkersRequest()
        got = self._fan_out([(s, req) for s in smap.shards], "ListWorkers", end, lambda resp, _e: worker_list(resp))
        results = [(s, as_worker_list(r)) for s, r in got]
        self._maybe_refresh(results)
        return merge_workers(smap, results)


def match(endpoint: str, keyspace: Keyspace, deadline: float = 0.002, **kw) -> MatchResult:
    """One-shot helper: `match("127.0.0.1:50151", ("m", 16, 1), tokens=[...])`. Takes
    IndexClient's TLS options and match()'s query arguments."""
    tls = {k: kw.pop(k) for k in ("root_certificates", "private_key", "certificate_chain", "server_name") if k in kw}
    with IndexClient([endpoint], deadline=deadline, **tls) as c:
        return c.match(keyspace, **kw)

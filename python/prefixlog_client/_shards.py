"""Sharded fan-out, shared by the sync and the asyncio client (no I/O here): the shard map, one
request per shard, and the merge of the shards' answers into one result.

A replica started with `serve --shard I/N` owns the partitions p with p % N == I and answers
only for the workers of those partitions (a worker's records live in one partition:
`partition_of`). A client therefore asks one replica of every shard and takes the union of
their scores, which is exact. The map is

  * static: `{shard_key: [endpoints]}` or a list of endpoint groups (keys "0", "1", ...); a
    shard's partitions are learned from its first answer; or
  * discovered: every endpoint given is asked `Describe`, endpoints reporting the same set of
    partitions form one shard (key "I/N"), ready replicas first. While a log is being
    resharded, replicas of two layouts answer (e.g. unsharded and `--shard I/2`): the layout
    used is the one whose shards are all ready and cover every partition, the one with more
    shards if both do (see `build_map`).

Within a shard, endpoints are replicas of the same partitions: tried in order, the last one
that answered first (prefixlog_client._transport.Failover). Shards are asked in parallel under
the query's one deadline; a shard that does not answer in time leaves its partitions out of
the answer, which is flagged `partial` (fail open per shard).
"""
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._proto import query_pb2
from ._transport import endpoint_list
from ._wire import MatchResult, WorkerList
from .partitioning import partition_of
from .tokens import merge_tokens

log = logging.getLogger("prefixlog_client")

# A shard's answer that says "this keyspace has no holder here": a replica only knows the
# keyspaces its own partitions' records created, so one shard may not know a keyspace another
# serves. Only when every shard says so is the keyspace unknown (the single-shard outcome).
_NOT_FOUND = "rejected: NOT_FOUND"


@dataclass
class Shard:
    """Replicas of one set of partitions. `partitions` is None until known (a static shard
    before its first answer, or a replica that predates shard coverage)."""

    key: str
    endpoints: List[str]
    partitions: Optional[FrozenSet[int]] = None
    preferred: int = 0  # index into endpoints: the last one that answered


@dataclass
class ShardMap:
    shards: List[Shard]
    partition_count: int = 0  # of the whole log; 0 until known
    built_at: float = field(default_factory=time.monotonic)

    def learn(self, shard: Shard, result: Union[MatchResult, WorkerList], partition_count: int = 0) -> None:
        """Takes a shard's partitions (and the log's partition count) from its answer."""
        if result.partitions:
            shard.partitions = frozenset(result.partitions)
        if partition_count:
            self.partition_count = partition_count


ShardSpec = Union[Mapping[str, Sequence[str]], Sequence[Sequence[str]]]


def static_map(shards: ShardSpec) -> ShardMap:
    """A map from `{shard_key: [endpoints]}` or `[[endpoints of shard 0], [... of shard 1]]`."""
    if isinstance(shards, Mapping):
        items = [(str(k), endpoint_list(v)) for k, v in shards.items()]
    elif isinstance(shards, str):
        raise ValueError("shards= takes a {key: [endpoints]} map or a list of endpoint lists, not a string")
    else:
        items = [(str(i), endpoint_list(v)) for i, v in enumerate(shards)]
    seen: Dict[str, str] = {}
    for key, endpoints in items:
        if not endpoints:
            raise ValueError(f"shard {key!r} has no endpoints")
        for e in endpoints:
            if e in seen:
                raise ValueError(f"endpoint {e} is in shards {seen[e]!r} and {key!r}")
            seen[e] = key
    return ShardMap([Shard(key, endpoints) for key, endpoints in items])


@dataclass
class Described:
    """One endpoint's Describe answer (or a replica without Describe, which serves it all)."""

    endpoint: str
    partitions: Optional[FrozenSet[int]]  # None: predates Describe, serves every partition
    partition_count: int = 0
    shard: int = 0
    shard_count: int = 1
    ready: bool = True

    @classmethod
    def of(cls, endpoint: str, resp: query_pb2.DescribeResponse) -> "Described":
        return cls(
            endpoint,
            frozenset(resp.partitions) if resp.partitions else None,
            resp.partition_count,
            resp.shard,
            max(resp.shard_count, 1),
            resp.ready,
        )


def build_map(described: Sequence[Described], seeds: Sequence[str], previous: Optional[ShardMap]) -> Optional[ShardMap]:
    """The shard map from the endpoints' Describe answers (`seeds` in the caller's order), or
    None when no endpoint answered (keep the previous map).

    Endpoints reporting the same partitions are one shard, ready ones first, then in `seeds`
    order. If the groups overlap (replicas of two layouts during resharding), one layout
    (shard count) is used: among those whose shards are all ready and cover every partition,
    the one with the most shards; else the complete one with the most shards; else the one
    covering most partitions (its answers are flagged partial). Endpoints that did not answer
    stay at the end of the shard they were in, so failover still reaches them if they return;
    a shard of the layout with no replica answering stays in the map (`--shard I/N` owns the
    partitions p % N == I), so that answers name it as missing.
    """
    if not described:
        return None
    order = {e: i for i, e in enumerate(seeds)}
    count = max(d.partition_count for d in described)
    everything = frozenset(range(count))
    if count:  # replicas older than Describe serve every partition: one shard with unsharded ones
        described = [d if d.partitions is not None else replace(d, partitions=everything) for d in described]
    groups: Dict[Optional[FrozenSet[int]], List[Described]] = {}
    for d in described:
        groups.setdefault(d.partitions, []).append(d)

    def covered(gs: Iterable[Optional[FrozenSet[int]]]) -> FrozenSet[int]:
        out: FrozenSet[int] = frozenset()
        for g in gs:
            out |= everything if g is None else g
        return out

    layouts: Dict[int, List[Optional[FrozenSet[int]]]] = {}
    for parts, members in groups.items():
        layouts.setdefault(1 if parts is None else members[0].shard_count, []).append(parts)

    def rank(item: Tuple[int, List[Optional[FrozenSet[int]]]]):
        n, gs = item
        complete = covered(gs) >= everything
        ready = all(any(d.ready for d in groups[g]) for g in gs)
        return (complete and ready, complete, len(covered(gs)), n)

    _, chosen = max(layouts.items(), key=rank)
    old = {s.key: s for s in previous.shards} if previous else {}
    answered = {d.endpoint for d in described}
    shards = []
    keys = set()
    for parts in sorted(chosen, key=lambda g: min(g) if g else -1):
        members = sorted(groups[parts], key=lambda d: (not d.ready, order.get(d.endpoint, len(order))))
        first = members[0]
        key = "all" if parts is None else f"{first.shard}/{first.shard_count}"
        if key in keys:  # two partition sets claiming one shard index: misconfigured, keep both apart
            key = f"{key}:{','.join(map(str, sorted(parts or ())))}"
        keys.add(key)
        endpoints = [d.endpoint for d in members]
        before = old.get(key)
        if before is not None and before.partitions == parts:
            endpoints += [e for e in before.endpoints if e not in answered]
        preferred = 0  # the first ready replica, unless the one that answered last still is
        if before is not None and before.endpoints:
            last = before.endpoints[before.preferred % len(before.endpoints)]
            if last in [d.endpoint for d in members if d.ready]:
                preferred = endpoints.index(last)
        shards.append(Shard(key, endpoints, parts, preferred))
    # Shards of the layout that no replica answered for stay in the map (with the endpoints
    # they had, if any): answers keep naming them as missing, and failover finds them back.
    n = max((groups[g][0].shard_count for g in chosen if g is not None), default=1)
    for i in range(n if n > 1 and count else 0):
        key = f"{i}/{n}"
        if key not in keys:
            before = old.get(key)
            endpoints = [e for e in before.endpoints if e not in answered] if before else []
            shards.append(Shard(key, endpoints, frozenset(p for p in range(count) if p % n == i)))
    shards.sort(key=lambda s: min(s.partitions) if s.partitions else -1)
    return ShardMap(shards, count)


def shard_requests(smap: ShardMap, req: query_pb2.MatchRequest) -> List[Tuple[Shard, Optional[query_pb2.MatchRequest]]]:
    """One request per shard: when a shard's partitions are known, only its partitions'
    consistency tokens and candidate workers. None for a shard none of whose workers is a
    candidate (nothing to ask: an empty candidate list would mean "every worker")."""
    out: List[Tuple[Shard, Optional[query_pb2.MatchRequest]]] = []
    n = smap.partition_count
    for shard in smap.shards:
        owned = shard.partitions
        if owned is None or not n:
            out.append((shard, req))
            continue
        tokens = [o for o in req.min_offsets if o.partition in owned]
        candidates = [w for w in req.candidate_workers if partition_of(w, n) in owned]
        if req.candidate_workers and not candidates:
            out.append((shard, None))
            continue
        if len(tokens) == len(req.min_offsets) and len(candidates) == len(req.candidate_workers):
            out.append((shard, req))
            continue
        r = query_pb2.MatchRequest()
        r.CopyFrom(req)
        del r.min_offsets[:]
        r.min_offsets.extend(tokens)
        del r.candidate_workers[:]
        r.candidate_workers.extend(candidates)
        out.append((shard, r))
    return out


def skipped(shard: Shard) -> MatchResult:
    """The result of a shard that had nothing to answer (no candidate worker in it)."""
    return MatchResult("empty", reason="no candidate worker in this shard", partitions=sorted(shard.partitions or ()))


def _coverage(
    smap: ShardMap, answered: Sequence[Tuple[Shard, Sequence[int], bool]], missing: Sequence[Shard]
) -> Tuple[List[int], List[int]]:
    """(partitions covered, partitions missing) given the shards that answered -- (shard, the
    partitions its answer named, whether it covers everything: a replica that predates shard
    coverage) -- and those that did not."""
    count = smap.partition_count
    cover: set = set()
    known = True
    for shard, parts, everything in answered:
        if everything:
            return list(range(count)), []
        parts = parts or sorted(shard.partitions or ())
        known &= bool(parts)
        cover.update(parts)
    if count and known:
        return sorted(cover), sorted(set(range(count)) - cover)
    lost = set()
    for shard in missing:
        lost.update(shard.partitions or ())
    return sorted(cover), sorted(lost - cover)


def _better(a, b) -> bool:
    """Whether score `a` is a better answer than `b` (deeper, then not gapped, then more blocks)."""
    return (a.depth, not a.gapped, a.total_blocks) > (b.depth, not b.gapped, b.total_blocks)


def order_key(s):
    """The server's order of scores: weighted score descending (0 without tier weights), depth
    descending, then worker, dp rank, lane."""
    return (-s.weighted_score, -s.depth, s.worker, s.dp_rank, s.lane)


def merge_matches(smap: ShardMap, results: Sequence[Tuple[Shard, MatchResult]], top_k: Optional[int]) -> MatchResult:
    """One MatchResult from every shard's: the union of the scores (a worker's scores from one
    shard only), `top_k` applied after the merge, the shards' tokens together in `applied`,
    and the shards that did not answer named (`partial`)."""
    per_shard = {shard.key: r for shard, r in results}
    for shard, r in results:
        if r.outcome != "unavailable":
            smap.learn(shard, r, r.partition_count)
    if all(r.reason.startswith(_NOT_FOUND) for _, r in results):
        first = replace(results[0][1], shards=per_shard)
        return first  # the keyspace is unknown to every shard: the single-shard outcome
    answered = [(s, r) for s, r in results if r.outcome != "unavailable" or r.reason.startswith(_NOT_FOUND)]
    missing = [(s, r) for s, r in results if not (r.outcome != "unavailable" or r.reason.startswith(_NOT_FOUND))]
    if not answered:
        s, first = missing[0]
        return MatchResult(
            "unavailable",
            reason=first.reason,
            endpoint=first.endpoint,
            partial=True,
            missing_shards=[s.key for s, _ in missing],
            missing_partitions=_coverage(smap, [], [s for s, _ in missing])[1],
            partition_count=smap.partition_count,
            shards=per_shard,
        )
    # Which shard reports each worker; a worker reported by two is an anomaly: keep the shard
    # whose best score for it is better.
    best: Dict[int, Tuple[int, object]] = {}
    anomalies = 0
    for i, (_, r) in enumerate(answered):
        seen_here: Dict[int, object] = {}
        for s in r.scores:
            if s.worker not in seen_here or _better(s, seen_here[s.worker]):
                seen_here[s.worker] = s
        for w, s in seen_here.items():
            if w in best:
                anomalies += 1
                j, other = best[w]
                log.warning(
                    "protocol anomaly: worker %d reported by shards %s and %s; keeping the better answer",
                    w, answered[j][0].key, answered[i][0].key,
                )
                if _better(s, other):
                    best[w] = (i, s)
            else:
                best[w] = (i, s)
    scores = [s for i, (_, r) in enumerate(answered) for s in r.scores if best[s.worker][0] == i]
    scores.sort(key=order_key)
    if top_k is not None:
        del scores[top_k:]
    covered, lost = _coverage(
        smap,
        [(s, r.partitions, r.outcome != "unavailable" and not r.partitions and not r.partition_count and not r.reason)
         for s, r in answered],
        [s for s, _ in missing],
    )
    why = [f"{s.key}: {r.reason}" for s, r in missing]
    if lost and not missing:
        why = [f"partitions {lost} are owned by no shard of the map"]
    return MatchResult(
        "scores" if scores else "empty",
        scores=scores,
        applied=merge_tokens(*(r.applied for _, r in answered)),
        replica_id=",".join(r.replica_id for _, r in answered if r.replica_id),
        stale=any(r.stale for _, r in answered),
        reason="partial: " + "; ".join(why) if why else "",
        endpoint=",".join(r.endpoint for _, r in answered if r.endpoint),
        partitions=covered,
        partition_count=smap.partition_count,
        partial=bool(missing or lost),
        missing_shards=[s.key for s, _ in missing],
        missing_partitions=lost,
        shards=per_shard,
        anomalies=anomalies,
    )


def mark_coverage(smap: ShardMap, shard: Shard, r: MatchResult) -> MatchResult:
    """A single shard's answer as it is, flagged partial when it does not cover the whole log
    (e.g. one `--shard 0/2` replica asked alone)."""
    if r.outcome == "unavailable":
        return r
    smap.learn(shard, r, r.partition_count)
    if r.partitions and r.partition_count and len(r.partitions) < r.partition_count:
        r.partial = True
        r.missing_partitions = sorted(set(range(r.partition_count)) - set(r.partitions))
    return r


def merge_workers(smap: ShardMap, results: Sequence[Tuple[Shard, WorkerList]]) -> WorkerList:
    """ListWorkers of every shard as one list (ascending by worker id)."""
    answered = [(s, r) for s, r in results if r.outcome == "workers"]
    missing = [(s, r) for s, r in results if r.outcome != "workers"]
    for s, r in answered:
        smap.learn(s, r, r.partition_count)
    if not answered:
        s, first = missing[0] if missing else (None, WorkerList("unavailable", reason="disconnected: no shard map"))
        return replace(first, missing_shards=[s.key for s, _ in missing])
    by_worker: Dict[int, object] = {}
    anomalies = 0
    for s, r in answered:
        for w in r.workers:
            if w.worker in by_worker:
                anomalies += 1
                log.warning("protocol anomaly: worker %d listed by two shards", w.worker)
                continue
            by_worker[w.worker] = w
    covered, lost = _coverage(smap, [(s, r.partitions, False) for s, r in answered], [s for s, _ in missing])
    return WorkerList(
        "workers",
        workers=[by_worker[w] for w in sorted(by_worker)],
        partitions=covered,
        reason="partial: " + "; ".join(f"{s.key}: {r.reason}" for s, r in missing) if missing else "",
        partial=bool(missing or lost),
        missing_shards=[s.key for s, _ in missing],
        missing_partitions=lost,
        anomalies=anomalies,
        partition_count=smap.partition_count,
    )


class Refresh:
    """When a discovered map is asked again: every `interval` seconds, and sooner (at most every
    `min_interval`) after a query found a shard with no replica answering. Queries trigger the
    refresh; it runs in the background and swaps the map when done."""

    def __init__(self, interval: float, min_interval: float = 1.0):
        self.interval = interval
        self.min_interval = min(min_interval, interval)
        self.last = time.monotonic()
        self.running = False
        self.wanted = False

    def due(self) -> bool:
        if self.running:
            return False
        age = time.monotonic() - self.last
        return age >= self.interval or (self.wanted and age >= self.min_interval)

    def start(self) -> None:
        self.running = True
        self.wanted = False
        self.last = time.monotonic()

    def done(self) -> None:
        self.running = False
        self.last = time.monotonic()


def shard_failed(results: Sequence[Tuple[Shard, Union[MatchResult, WorkerList]]]) -> bool:
    """Whether some shard had no replica answering (not a rejected request): worth a refresh."""
    return any(r.outcome == "unavailable" and not r.reason.startswith("rejected") for _, r in results)


def plan(endpoints: Sequence[str], shards: Optional[ShardSpec], discover: bool) -> Tuple[List[str], Optional[ShardMap]]:
    """A client's endpoints and first map from its constructor arguments: a static `shards`
    map; with `discover`, no map yet (the endpoints are asked Describe); otherwise one shard of
    all `endpoints` -- the unsharded client, which behaves as before sharding existed."""
    if shards is not None:
        if endpoint_list(endpoints):
            raise ValueError("pass endpoints= or shards=, not both")
        if discover:
            raise ValueError("discover=True builds the map from endpoints=; shards= is a static map")
        smap = static_map(shards)
        return [e for s in smap.shards for e in s.endpoints], smap
    endpoints = endpoint_list(endpoints)
    return endpoints, None if discover else ShardMap([Shard("0", endpoints)])


def described(endpoint: str, resp: Optional[query_pb2.DescribeResponse], error: Optional[Exception]) -> Optional[Described]:
    """An endpoint's Describe outcome: its answer; a replica that predates Describe
    (UNIMPLEMENTED) serves every partition; any other failure: None (not in the map)."""
    if error is None:
        return Described.of(endpoint, resp)
    code = getattr(error, "code", None)
    if callable(code) and code() is not None and code().name == "UNIMPLEMENTED":
        return Described(endpoint, None)
    return None


def fan_out_calls(smap: ShardMap, req: query_pb2.MatchRequest) -> Tuple[List[Tuple[Shard, query_pb2.MatchRequest]], Dict[str, MatchResult]]:
    """(the shards to ask, with their requests; the results of shards with nothing to ask)."""
    calls, preset = [], {}
    for shard, r in shard_requests(smap, req):
        if r is None:
            preset[shard.key] = skipped(shard)
        else:
            calls.append((shard, r))
    return calls, preset


def in_map_order(smap: ShardMap, asked: Sequence[Tuple[Shard, MatchResult]], preset: Dict[str, MatchResult]) -> List[Tuple[Shard, MatchResult]]:
    got = {s.key: r for s, r in asked}
    got.update(preset)
    return [(s, got[s.key]) for s in smap.shards if s.key in got]


NO_MAP = "disconnected: no shard map (no endpoint answered Describe)"


def as_worker_list(r: Union[MatchResult, WorkerList]) -> WorkerList:
    """A ListWorkers call's result: its answer, or the failover's "unavailable" as a WorkerList."""
    return r if isinstance(r, WorkerList) else WorkerList("unavailable", reason=r.reason)

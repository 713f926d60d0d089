"""prefixlog's Python client: canonical block hashes and a fail-open `match()`.

    from prefixlog_client import IndexClient, block_hashes
    c = IndexClient(["127.0.0.1:50151"], deadline=0.002)
    r = c.match(("my-model", 16, 1), tokens=token_ids)
    if r.outcome == "scores": route_to(r.scores[0].worker)
    else: route_without_index()   # "empty" or "unavailable": never an exception

Sharded logs (`serve --shard I/N`): `IndexClient(shards={...})` or `IndexClient(endpoints,
discover=True)` fans each query out to one replica per shard and merges the answers (a shard
that does not answer in time makes the result `partial`, never an exception).

`AsyncIndexClient` is the same client for asyncio (`await c.match(...)`). Consistency tokens
(`min_offsets`, `MatchResult.applied`) are next offsets: see prefixlog_client.tokens. The gRPC
stubs in prefixlog_client._proto are generated from ../proto and committed
(`python -m prefixlog_client.codegen` regenerates them).
"""
from ._shards import Shard
from ._wire import Keyspace, MatchResult, Score, WorkerInfo, WorkerList
from .aio import AsyncIndexClient
from .client import IndexClient, match
from .partitioning import partition_of
from .scheme import SCHEME_XXH3_CHAINED, block_hashes, namespace_seed
from .tokens import Token, merge_tokens, token_from_ack

__all__ = [
    "AsyncIndexClient",
    "IndexClient",
    "Keyspace",
    "MatchResult",
    "SCHEME_XXH3_CHAINED",
    "Score",
    "Shard",
    "WorkerInfo",
    "WorkerList",
    "Token",
    "block_hashes",
    "match",
    "merge_tokens",
    "namespace_seed",
    "partition_of",
    "token_from_ack",
]

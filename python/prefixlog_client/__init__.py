"""prefixlog's Python client: canonical block hashes and a fail-open `match()`.

    from prefixlog_client import IndexClient, block_hashes
    c = IndexClient(["127.0.0.1:50151"], deadline=0.002)
    r = c.match(("my-model", 16, 1), tokens=token_ids)
    if r.outcome == "scores": route_to(r.scores[0].worker)
    else: route_without_index()   # "empty" or "unavailable": never an exception

The gRPC stubs are generated from ../proto (`python -m prefixlog_client.codegen`).
"""
from .scheme import SCHEME_XXH3_CHAINED, block_hashes, namespace_seed


def __getattr__(name):
    # The client needs the generated stubs; importing it lazily lets `python -m
    # prefixlog_client.codegen` (which generates them) import this package first.
    if name in ("IndexClient", "MatchResult", "Score", "match"):
        from . import client

        return getattr(client, name)
    raise AttributeError(name)


__all__ = ["IndexClient", "match", "MatchResult", "Score", "block_hashes", "namespace_seed", "SCHEME_XXH3_CHAINED"]

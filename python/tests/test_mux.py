"""The stream multiplexers (prefixlog_client.mux) against a live replica (run_tests.sh), sync
and asyncio alike: answers and in-band errors routed to their callers, a timed-out query that
leaves the stream open, and a broken stream that fails its pending queries retriably and is
replaced by the next query."""
import asyncio
import os
import threading
import time

import grpc
import grpc.aio
import pytest

from prefixlog_client._proto import query_pb2
from prefixlog_client._wire import match_request
from prefixlog_client.mux import AsyncStreamMux, MuxBroken, MuxStatus, MuxTimeout, StreamMux
from prefixlog_client import IndexClient
from test_live import KS, full_chain_answer, last_chain

ADDR = os.environ.get("PREFIXLOG_GRPC")
pytestmark = pytest.mark.skipif(not ADDR, reason="PREFIXLOG_GRPC not set (run python/run_tests.sh)")
# A token no replica reaches: the replica waits for it until the query's own timeout (less a
# margin), 10 s at most.
NEVER = [(0, 10**12)]
# Queries a replica works on at once per stream (QueryConfig::max_in_flight_per_stream's
# default, which `prefixlog serve` uses).
HOLD = 32


def req(hashes, keyspace=KS, min_offsets=()):
    return match_request(keyspace, hashes=hashes, min_offsets=list(min_offsets))


def cases(chain):
    """(request, check, timeout) triples: a full-chain answer, an empty one, two in-band errors,
    and a query whose token is never reached, answered last (DEADLINE_EXCEEDED in band, or a
    client timeout), so answers come back out of the order the queries were sent in."""
    return [
        (req(chain), lambda r: r.scores[0].depth == len(chain), 10),
        (req([12345]), lambda r: len(r.scores) == 0, 10),
        (req([]), grpc.StatusCode.INVALID_ARGUMENT, 10),
        (req([1], keyspace=("no-such-model", 64, 1)), grpc.StatusCode.NOT_FOUND, 10),
        (req(chain, min_offsets=NEVER), grpc.StatusCode.DEADLINE_EXCEEDED, 0.5),
    ]


def check(case, outcome):
    want = case[1]
    if want == grpc.StatusCode.DEADLINE_EXCEEDED and isinstance(outcome, MuxTimeout):
        return
    if isinstance(want, grpc.StatusCode):
        assert isinstance(outcome, MuxStatus) and outcome.code == want, outcome
    else:
        assert not isinstance(outcome, Exception) and want(outcome), outcome


@pytest.fixture(scope="module")
def chain():
    c = IndexClient([ADDR], deadline=2.0)
    try:
        full_chain_answer(c, last_chain())
    finally:
        c.close()
    return last_chain()


def outcome_of(fn):
    try:
        return fn()
    except Exception as e:  # the MuxError under test
        return e


def test_sync_routes_every_answer_to_its_caller(chain):
    ch = grpc.insecure_channel(ADDR)
    mux = StreamMux(ch)
    todo = cases(chain) * 10
    got = [None] * len(todo)

    def ask(i):
        got[i] = outcome_of(lambda: mux.ask(todo[i][0], timeout=todo[i][2]))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(todo))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for case, outcome in zip(todo, got):
        check(case, outcome)
    assert (mux.streams_opened, mux.in_flight()) == (1, 0)
    mux.close()
    ch.close()


def test_sync_timeout_leaves_the_stream_open_and_a_break_is_retriable(chain):
    ch = grpc.insecure_channel(ADDR)
    mux = StreamMux(ch)
    # HOLD queries wait for a token never reached (the replica ends each wait a margin before
    # its 1 s timeout); the next query is read only when one of them ends, after its own
    # 0.05 s: it times out in the client, and its late answer is dropped.
    holders = [threading.Thread(target=outcome_of, args=(lambda: mux.ask(req([1], min_offsets=NEVER), timeout=1.0),))
               for _ in range(HOLD)]
    for t in holders:
        t.start()
    while mux.in_flight() < HOLD:
        time.sleep(0.001)
    with pytest.raises(MuxTimeout):
        mux.ask(req(chain), timeout=0.05)
    for t in holders:
        t.join()
    assert mux.ask(req(chain), timeout=10).scores[0].depth == len(chain)
    assert (mux.streams_opened, mux.in_flight()) == (1, 0)
    # A query pending when the stream breaks fails retriably; the next one opens a new stream.
    pending = []
    t = threading.Thread(target=lambda: pending.append(outcome_of(lambda: mux.ask(req([1], min_offsets=NEVER), timeout=30))))
    t.start()
    while mux.in_flight() == 0:
        time.sleep(0.001)
    mux._conn.call.cancel()  # what a lost connection looks like to the reader
    t.join()
    assert isinstance(pending[0], MuxBroken) and pending[0].retriable, pending
    assert mux.ask(req(chain), timeout=10).scores[0].depth == len(chain)
    assert mux.streams_opened == 2
    mux.close()
    ch.close()


def test_asyncio_multiplexer(chain):
    async def run():
        async with grpc.aio.insecure_channel(ADDR) as ch:
            mux = AsyncStreamMux(ch)
            todo = cases(chain) * 10
            got = await asyncio.gather(*(mux.ask(r, timeout=t) for r, _, t in todo), return_exceptions=True)
            for case, outcome in zip(todo, got):
                check(case, outcome)
            assert (mux.streams_opened, mux.in_flight()) == (1, 0)
            holders = [asyncio.ensure_future(mux.ask(req([1], min_offsets=NEVER), timeout=1.0)) for _ in range(HOLD)]
            while mux.in_flight() < HOLD:
                await asyncio.sleep(0.001)
            with pytest.raises(MuxTimeout):
                await mux.ask(req(chain), timeout=0.05)
            await asyncio.gather(*holders, return_exceptions=True)
            assert (await mux.ask(req(chain), timeout=10)).scores[0].depth == len(chain)
            assert (mux.streams_opened, mux.in_flight()) == (1, 0)
            pending = asyncio.ensure_future(mux.ask(req([1], min_offsets=NEVER), timeout=30))
            while mux.in_flight() == 0:
                await asyncio.sleep(0.01)
            mux._conn.call.cancel()
            e = (await asyncio.gather(pending, return_exceptions=True))[0]
            assert isinstance(e, MuxBroken) and e.retriable, e
            assert (await mux.ask(req(chain), timeout=10)).scores[0].depth == len(chain)
            assert mux.streams_opened == 2
            await mux.close()

    asyncio.run(run())


def test_in_band_error_fields_exist():
    """The stubs carry the additive fields (a stale stub would drop them silently)."""
    r = query_pb2.MatchRequest(in_band_errors=True, unordered=True)
    assert r.in_band_errors and r.unordered
    a = query_pb2.MatchResponse(error=query_pb2.MatchError(code=3, message="m"))
    assert a.HasField("error") and a.error.code == 3


def test_index_clients_stream_when_asked(client_factory, chain):
    """IndexClient and AsyncIndexClient with streaming=True: the unary outcomes, over streams."""
    c = client_factory([ADDR], deadline=5.0, streaming=True)
    r = c.match(KS, hashes=chain)
    assert r.outcome == "scores" and r.scores[0].depth == len(chain) and r.endpoint == ADDR, r
    r = c.match(("no-such-model", 64, 1), hashes=[1, 2])
    assert r.outcome == "unavailable" and r.reason.startswith("rejected: NOT_FOUND"), r
    assert c.match(KS, hashes=[12345]).outcome == "empty"
    r = c.match(KS, hashes=[1], min_offsets=NEVER, deadline=0.3)
    assert (r.outcome, r.reason) == ("unavailable", "timeout"), r
    r = c.match(KS, hashes=chain)
    assert r.outcome == "scores", r
    assert c._muxes[ADDR].streams_opened == 1


def test_sharded_index_client_streams(chain):
    shards = os.environ.get("PREFIXLOG_GRPC_SHARDS")
    if not shards:
        pytest.skip("PREFIXLOG_GRPC_SHARDS not set")
    c = IndexClient(shards=[[e] for e in shards.split(",")], deadline=5.0, streaming=True)
    try:
        r = c.match(KS, hashes=chain)
        assert r.outcome == "scores" and not r.partial and r.scores[0].depth == len(chain), r
    finally:
        c.close()

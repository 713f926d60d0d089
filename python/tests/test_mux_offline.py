"""The stream multiplexers' parts that need no replica (test_mux.py runs against a live one)."""
import queue

import grpc
import pytest

from prefixlog_client._proto import query_pb2
from prefixlog_client.mux import MuxBroken, MuxStatus, MuxTooLarge, StreamMux, _answer, _check_size, _Conn


class _Stub:
    """A stub whose stream ends at once, keeping the request iterator gRPC would read."""

    def MatchStream(self, requests):
        self.requests = requests
        return iter(())


def test_a_broken_stream_ends_its_request_iterator():
    stub = _Stub()
    conn = _Conn(stub)
    conn.fail(MuxBroken("gone"))
    # Non-blocking: before the fix the iterator waited forever for a sentinel never queued.
    items = []
    while True:
        try:
            items.append(conn.requests.get_nowait())
        except queue.Empty:
            break
    assert _Conn._END in items


def test_an_in_band_error_is_never_ok():
    for code, want in ((0, grpc.StatusCode.UNKNOWN), (3, grpc.StatusCode.INVALID_ARGUMENT)):
        response = query_pb2.MatchResponse()
        response.error.code, response.error.message = code, "m"
        try:
            _answer(response)
            raise AssertionError("no error raised")
        except MuxStatus as e:
            assert e.code == want


def _oversized():
    r = query_pb2.MatchRequest()
    r.tokens.ids.extend([2**32 - 1] * (1 << 20))  # 5 bytes each: over 4 MiB
    return r


class _NoStub:
    def MatchStream(self, requests):
        raise AssertionError("an oversized request must not open a stream")


def test_an_oversized_request_is_refused_before_the_stream():
    mux = StreamMux(grpc.insecure_channel("127.0.0.1:9"))
    mux._stub = _NoStub()
    with pytest.raises(MuxTooLarge) as e:
        mux.ask(_oversized(), timeout=5)
    assert not e.value.retriable and e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert mux.streams_opened == 0
    _check_size(query_pb2.MatchRequest())


def test_failover_stops_at_an_oversized_request():
    from prefixlog_client._transport import Failover

    f = Failover(["a:1", "b:1"], 0, budget=5)
    result = f.failed(0, MuxTooLarge(5 << 20))
    assert result is not None and result.reason.startswith("rejected: ")

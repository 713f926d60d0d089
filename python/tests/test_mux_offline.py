"""The stream multiplexers' parts that need no replica (test_mux.py runs against a live one)."""
import queue

import grpc

from prefixlog_client._proto import query_pb2
from prefixlog_client.mux import MuxBroken, MuxStatus, _answer, _Conn


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

"""Many queries over one long-lived MatchStream per replica: the Rust client's multiplexer
(client/src/mux.rs) for Python gateways, sync (`StreamMux`, threads) and asyncio
(`AsyncStreamMux`, grpc.aio).

    mux = StreamMux(grpc.insecure_channel("10.0.0.5:50151"))
    response = mux.ask(match_request, timeout=0.05)   # a query_pb2.MatchResponse

Every query gets a fresh request_id and asks for the multiplexed contract (`in_band_errors`,
`unordered`), so one query's failure or consistency-token wait affects no other; answers are
routed back by request_id. A query whose timeout passes raises `MuxTimeout` without closing the
stream (its late answer is dropped). If the stream breaks, every pending query raises
`MuxBroken` (retriable) and the next query opens a new stream. A query the replica answered with
an error raises `MuxStatus` (its gRPC status code and message).
"""
import asyncio
import itertools
import queue
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Dict, Optional, Tuple

import grpc

from ._proto import query_pb2, query_pb2_grpc

_CODES = {c.value[0]: c for c in grpc.StatusCode}
_BROKEN_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED}


class MuxError(Exception):
    """Why a multiplexed query has no answer."""

    retriable = False

    def status(self) -> Tuple[grpc.StatusCode, str]:
        """The status a unary call would have ended with (the clients' failover reads it)."""
        return grpc.StatusCode.UNAVAILABLE, str(self)


class MuxTimeout(MuxError):
    """The query's timeout passed; the stream stays open."""

    def status(self) -> Tuple[grpc.StatusCode, str]:
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(self)


class MuxBroken(MuxError):
    """The stream broke (or could not be opened) while the query was pending. Retriable: the
    next query opens a new stream."""

    retriable = True


class MuxStatus(MuxError):
    """The replica refused the stream or answered this query with an error (in band)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.retriable = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)

    def status(self) -> Tuple[grpc.StatusCode, str]:
        return self.code, self.message


class MuxTooLarge(MuxStatus):
    """The request is larger than a replica accepts; not sent (on the stream it would end it,
    failing every other pending query). Not retriable: every replica would refuse it."""

    def __init__(self, size: int):
        super().__init__(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the request is {size} bytes, over the {MAX_REQUEST_BYTES}-byte limit")
        self.retriable = False


# The largest request a replica decodes by default (its max_decoding_message_size, 4 MiB),
# less room for the fields _prepared sets; as the Rust client's MAX_REQUEST_BYTES.
MAX_REQUEST_BYTES = 4 << 20
_SET_FIELDS_BYTES = 32


def _check_size(request: query_pb2.MatchRequest):
    size = request.ByteSize() + _SET_FIELDS_BYTES
    if size > MAX_REQUEST_BYTES:
        raise MuxTooLarge(size)


def _prepared(request: query_pb2.MatchRequest, request_id: int, timeout: float) -> query_pb2.MatchRequest:
    """A copy of `request` with its id, the multiplexed contract's flags and its own deadline
    (the replica ends a token wait a margin before it, as for a unary call's deadline)."""
    r = query_pb2.MatchRequest()
    r.CopyFrom(request)
    r.request_id, r.in_band_errors, r.unordered = request_id, True, True
    r.timeout_us = max(1, int(timeout * 1e6))
    return r


def _answer(response: query_pb2.MatchResponse) -> query_pb2.MatchResponse:
    if response.HasField("error"):
        code = _CODES.get(response.error.code, grpc.StatusCode.UNKNOWN)
        if code == grpc.StatusCode.OK:  # an error is never OK (a replica bug, a corrupt answer)
            code = grpc.StatusCode.UNKNOWN
        raise MuxStatus(code, response.error.message)
    return response


def _stream_error(e: BaseException) -> MuxError:
    code = e.code() if isinstance(e, grpc.RpcError) and hasattr(e, "code") else None
    if code is None or code in _BROKEN_CODES:
        return MuxBroken(str(e))
    return MuxStatus(code, e.details())  # type: ignore[attr-defined]


class _Conn:
    """One open stream (sync): its request queue, the callers waiting and why it broke."""

    _END = object()

    def __init__(self, stub: query_pb2_grpc.PrefixIndexStub):
        self.requests: "queue.Queue" = queue.Queue()
        self.lock = threading.Lock()
        self.waiting: Dict[int, Future] = {}
        self.broken: Optional[MuxError] = None
        self.call = stub.MatchStream(iter(self.requests.get, self._END))
        threading.Thread(target=self._route, name="prefixlog-mux", daemon=True).start()

    def _route(self):
        try:
            for response in self.call:
                with self.lock:
                    fut = self.waiting.pop(response.request_id, None)  # None: late, dropped
                if fut is not None:
                    fut.set_result(response)
            why: MuxError = MuxBroken("the replica ended the stream")
        except Exception as e:  # grpc.RpcError when the stream breaks or is cancelled
            why = _stream_error(e)
        self.fail(why)

    def fail(self, why: MuxError):
        with self.lock:
            self.broken = self.broken or why
            pending, self.waiting = self.waiting, {}
            # Ends the request iterator, or gRPC's thread reading it blocks forever (one
            # leaked thread per broken stream). Under the lock: no request is queued after it.
            self.requests.put(self._END)
        for fut in pending.values():
            fut.set_exception(self.broken)

    def close(self):
        self.requests.put(self._END)
        self.call.cancel()


class StreamMux:
    """The multiplexer of one replica (sync, thread-safe). The stream opens on first use."""

    def __init__(self, channel: grpc.Channel):
        self._stub = query_pb2_grpc.PrefixIndexStub(channel)
        self._lock = threading.Lock()
        self._conn: Optional[_Conn] = None
        self._ids = itertools.count(1)
        self.streams_opened = 0

    def _connection(self) -> _Conn:
        with self._lock:
            if self._conn is None or self._conn.broken is not None:
                self._conn = _Conn(self._stub)
                self.streams_opened += 1
            return self._conn

    def ask(self, request: query_pb2.MatchRequest, timeout: float) -> query_pb2.MatchResponse:
        _check_size(request)
        conn = self._connection()
        request_id = next(self._ids)
        fut: Future = Future()
        with conn.lock:
            if conn.broken is not None:
                raise conn.broken
            conn.waiting[request_id] = fut
            # Under the lock (the queue is unbounded: never blocks), so the requests of the
            # queries counted by in_flight() are queued in that order.
            conn.requests.put(_prepared(request, request_id, timeout))
        try:
            return _answer(fut.result(timeout=timeout))
        except FutureTimeout:
            raise MuxTimeout("no answer within the query's timeout") from None
        finally:
            with conn.lock:
                conn.waiting.pop(request_id, None)

    def in_flight(self) -> int:
        conn = self._conn
        return 0 if conn is None else len(conn.waiting)

    def close(self):
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class _AsyncConn:
    """One open stream (asyncio)."""

    def __init__(self, stub: query_pb2_grpc.PrefixIndexStub):
        self.call = stub.MatchStream()
        self.waiting: Dict[int, asyncio.Future] = {}
        self.broken: Optional[MuxError] = None
        self.writing = asyncio.Lock()
        self.reader = asyncio.get_running_loop().create_task(self._route())

    async def _route(self):
        try:
            while True:
                response = await self.call.read()
                if response is grpc.aio.EOF:
                    why: MuxError = MuxBroken("the replica ended the stream")
                    break
                fut = self.waiting.pop(response.request_id, None)  # None: late, dropped
                if fut is not None and not fut.done():
                    fut.set_result(response)
        except asyncio.CancelledError:  # the call (or this task) was cancelled
            why = MuxBroken("the stream was cancelled")
        except Exception as e:  # grpc.aio.AioRpcError when the stream breaks
            why = _stream_error(e)
        self.fail(why)

    def fail(self, why: MuxError):
        self.broken = self.broken or why
        pending, self.waiting = self.waiting, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(self.broken)


class AsyncStreamMux:
    """The multiplexer of one replica for asyncio (grpc.aio channel, one event loop)."""

    def __init__(self, channel: "grpc.aio.Channel"):
        self._stub = query_pb2_grpc.PrefixIndexStub(channel)
        self._conn: Optional[_AsyncConn] = None
        self._ids = itertools.count(1)
        self.streams_opened = 0

    def _connection(self) -> _AsyncConn:
        if self._conn is None or self._conn.broken is not None:
            self._conn = _AsyncConn(self._stub)
            self.streams_opened += 1
        return self._conn

    async def ask(self, request: query_pb2.MatchRequest, timeout: float) -> query_pb2.MatchResponse:
        _check_size(request)
        conn = self._connection()
        request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        fut = loop.create_future()
        conn.waiting[request_id] = fut
        try:
            async with conn.writing:  # grpc.aio allows one write at a time
                await asyncio.wait_for(conn.call.write(_prepared(request, request_id, end - loop.time())), end - loop.time())
            return _answer(await asyncio.wait_for(fut, end - loop.time()))
        except asyncio.TimeoutError:
            raise MuxTimeout("no answer within the query's timeout") from None
        except (grpc.RpcError, asyncio.InvalidStateError) as e:  # the write failed: the stream is gone
            conn.fail(_stream_error(e))
            raise conn.broken from None  # type: ignore[misc]
        finally:
            conn.waiting.pop(request_id, None)

    def in_flight(self) -> int:
        return 0 if self._conn is None else len(self._conn.waiting)

    async def close(self):
        if self._conn is not None:
            self._conn.call.cancel()
            self._conn.reader.cancel()
            self._conn = None

"""An in-process stand-in for a replica's PrefixIndex service (grpcio's server), for tests of
what the clients send and how they read answers and failures, without `prefixlog serve`."""
import threading
from concurrent import futures

import grpc

from prefixlog_client._proto import query_pb2, query_pb2_grpc, records_pb2


def canned_response():
    """An answer using every MatchResponse field the clients read, the new ones included."""
    return query_pb2.MatchResponse(
        scores=[
            query_pb2.WorkerScore(worker=7, dp_rank=1, lane=2, depth=3, total_blocks=9, inferred=True,
                                  intervals=[query_pb2.Interval(start=0, end=3)], gapped=True),
            query_pb2.WorkerScore(worker=2**64 - 1, depth=1, total_blocks=1),
        ],
        applied=[records_pb2.PartitionOffset(partition=0, offset=41), records_pb2.PartitionOffset(partition=2, offset=7)],
        replica_id="fake",
        stale=True,
        partitions=[0, 2],
        partition_count=4,
    )


class FakeReplica(query_pb2_grpc.PrefixIndexServicer):
    """Answers Match with `response`, aborts with `abort` = (code, details), or with `hang` holds
    every call until the test ends. Records each request it received."""

    def __init__(self, response=None, abort=None, hang=False):
        self.response = response if response is not None else canned_response()
        self.abort = abort
        self.hang = hang
        self.requests = []
        self.released = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        query_pb2_grpc.add_PrefixIndexServicer_to_server(self, self._server)
        self.endpoint = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def Match(self, request, context):
        self.requests.append(request)
        if self.hang:
            self.released.wait(30)
        if self.abort:
            context.abort(*self.abort)
        return self.response

    def stop(self):
        self.released.set()
        self._server.stop(0)

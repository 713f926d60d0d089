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


def shard_response(partitions, scores, applied=None, partition_count=4, replica_id=""):
    """A sharded replica's answer: `scores` as (worker, depth[, total_blocks[, dp_rank, lane]])
    tuples, `applied` (default: offset 10 + p for each partition)."""
    applied = applied if applied is not None else [(p, 10 + p) for p in partitions]
    return query_pb2.MatchResponse(
        scores=[query_pb2.WorkerScore(**dict(zip(("worker", "depth", "total_blocks", "dp_rank", "lane"), s)))
                for s in scores],
        applied=[records_pb2.PartitionOffset(partition=p, offset=o) for p, o in applied],
        replica_id=replica_id,
        partitions=partitions,
        partition_count=partition_count,
    )


def describe(shard, shard_count, partition_count=4, ready=True, replica_id=""):
    """The Describe answer of a `--shard shard/shard_count` replica."""
    return query_pb2.DescribeResponse(
        replica_id=replica_id,
        partition_count=partition_count,
        partitions=[p for p in range(partition_count) if p % shard_count == shard],
        shard=shard,
        shard_count=shard_count,
        ready=ready,
    )


class FakeReplica(query_pb2_grpc.PrefixIndexServicer):
    """Answers Match with `response`, aborts with `abort` = (code, details), or with `hang` holds
    every call until the test ends. Describe answers `describe` (UNIMPLEMENTED when None),
    ListWorkers `workers` (a ListWorkersResponse). Records each request it received. Listens on
    `address` (default: a free port on 127.0.0.1), over TLS with `credentials`."""

    def __init__(self, response=None, abort=None, hang=False, describe=None, workers=None, address="127.0.0.1:0",
                 credentials=None):
        self.response = response if response is not None else canned_response()
        self.abort = abort
        self.hang = hang
        self.describe = describe
        self.workers = workers if workers is not None else query_pb2.ListWorkersResponse()
        self.requests = []
        self.describes = 0
        self.released = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        query_pb2_grpc.add_PrefixIndexServicer_to_server(self, self._server)
        # `address`: another loopback address (several fakes behind one name, on one port);
        # `credentials`: grpc.ssl_server_credentials for a TLS port.
        host = address.rpartition(":")[0]
        if credentials is None:
            port = self._server.add_insecure_port(address)
        else:
            port = self._server.add_secure_port(address, credentials)
        self.port = port
        self.endpoint = f"{host}:{port}"
        self._server.start()

    def Match(self, request, context):
        self.requests.append(request)
        if self.hang:
            self.released.wait(30)
        if self.abort:
            context.abort(*self.abort)
        return self.response

    def Describe(self, request, context):
        self.describes += 1
        if self.hang:
            self.released.wait(30)
        if self.describe is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found")
        return self.describe

    def ListWorkers(self, request, context):
        if self.hang:
            self.released.wait(30)
        if self.abort:
            context.abort(*self.abort)
        return self.workers

    def stop(self):
        self.released.set()
        self._server.stop(0)

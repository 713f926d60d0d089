import asyncio

import pytest

from fake_replica import FakeReplica
from prefixlog_client import AsyncIndexClient, IndexClient


@pytest.fixture
def fake_replica():
    """A factory of in-process fake replicas (FakeReplica keyword arguments), all stopped at
    the end of the test."""
    started = []

    def start(**kw):
        started.append(FakeReplica(**kw))
        return started[-1]

    yield start
    for replica in started:
        replica.stop()


class AsyncAsSync:
    """AsyncIndexClient behind IndexClient's synchronous interface (one event loop for the
    client's lifetime), so a test can run the same checks against both clients."""

    def __init__(self, *args, **kw):
        self._client = AsyncIndexClient(*args, **kw)
        self._loop = asyncio.new_event_loop()

    def match(self, *args, **kw):
        return self._loop.run_until_complete(self._client.match(*args, **kw))

    def close(self):
        self._loop.run_until_complete(self._client.close())
        self._loop.close()


@pytest.fixture(params=["sync", "asyncio"])
def client_factory(request):
    """Builds IndexClient or (through AsyncAsSync) AsyncIndexClient; closes them afterwards."""
    made = []

    def make(*args, **kw):
        made.append((IndexClient if request.param == "sync" else AsyncAsSync)(*args, **kw))
        return made[-1]

    yield make
    for client in made:
        client.close()

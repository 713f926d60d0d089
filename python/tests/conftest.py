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

    def list_workers(self, *args, **kw):
        return self._loop.run_until_complete(self._client.list_workers(*args, **kw))

    def refresh(self):
        return self._loop.run_until_complete(self._client.refresh())

    def enter(self):
        """What `async with` does on entry (a discovered map is built)."""
        self._loop.run_until_complete(self._client.__aenter__())
        return self

    def run_briefly(self, seconds):
        """Lets the loop run (background refreshes) for `seconds`."""
        self._loop.run_until_complete(asyncio.sleep(seconds))

    def __getattr__(self, name):  # shards, endpoints, protocol_anomalies, ...
        return getattr(self._client, name)

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

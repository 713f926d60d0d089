"""What the client puts on the wire (no replica needed): the stub is replaced by a recorder."""
from prefixlog_client import IndexClient


class Recorder:
    def __init__(self):
        self.requests = []

    def Match(self, req, timeout):
        self.requests.append(req)
        raise RuntimeError("recorded")  # the client fails open on anything


def test_token_prompt_carries_its_namespace_and_fails_open():
    c = IndexClient(["127.0.0.1:1"], deadline=0.5)
    rec = Recorder()
    c._stubs = [rec]
    r = c.match(("m", 4, 1), tokens=[1, 2, 3, 4], namespace="sql-adapter")
    assert r.outcome == "unavailable"
    assert list(rec.requests[0].tokens.ids) == [1, 2, 3, 4]
    assert rec.requests[0].tokens.namespace == "sql-adapter"
    c.match(("m", 4, 1), tokens=[1, 2, 3, 4])
    assert rec.requests[1].tokens.namespace == ""
    c.close()

"""What the sync and the asyncio client share around the RPC: channel security (TLS, mutual
TLS) and the failover walk over the endpoints within one deadline, with the fail-open mapping
of every error to an "unavailable" outcome and its reason."""
import time
from typing import Iterator, List, Optional, Sequence, Tuple

import grpc

from ._wire import MatchResult
from .mux import MuxError, MuxTooLarge

# Statuses after which the next endpoint may well answer: the replica is down, overloaded or
# broke the call. Any other status is the request's fault and would fail everywhere.
_TRY_NEXT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN}


class ChannelSecurity:
    """How to open a channel: plaintext, TLS (`root_certificates`: PEM of the CA that signed
    the replicas' certificate) or mutual TLS (also `private_key` and `certificate_chain`, PEM).
    `server_name` overrides the name checked against the certificate (e.g. when connecting by
    an address the certificate does not list). Inconsistent options raise ValueError up front."""

    def __init__(
        self,
        root_certificates: Optional[bytes] = None,
        private_key: Optional[bytes] = None,
        certificate_chain: Optional[bytes] = None,
        server_name: Optional[str] = None,
    ):
        if (private_key is None) != (certificate_chain is None):
            raise ValueError("mutual TLS needs both private_key and certificate_chain")
        self.tls = root_certificates is not None or certificate_chain is not None
        if not self.tls and server_name is not None:
            raise ValueError("server_name only applies to TLS")
        self._credentials = (
            grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain) if self.tls else None
        )
        self.server_name = server_name

    def open(self, grpc_module, endpoint: str, seed_name: Optional[str] = None):
        """A channel to `endpoint` from `grpc_module`: `grpc` (sync) or `grpc.aio`, whose
        channel constructors take the same arguments. `seed_name`: the name `endpoint` (an
        address) was resolved from, checked against the certificate unless `server_name` was
        given."""
        if self._credentials is None:
            return grpc_module.insecure_channel(endpoint)
        name = self.server_name or seed_name
        options = [("grpc.ssl_target_name_override", name)] if name else []
        return grpc_module.secure_channel(endpoint, self._credentials, options=options)


class Failover:
    """One query's walk over the endpoints: the preferred one (the last that answered) first,
    then the others in order, all within `budget` seconds. Each attempt gets what is left split
    over the endpoints still to try, so a hung replica costs at most its share (the Rust
    client's policy). Errors never escape: `failed` turns each into a reason, and either a final
    "unavailable" result or a go-ahead for the next endpoint."""

    def __init__(self, endpoints: Sequence[str], preferred: int, budget: float, end: Optional[float] = None):
        self.endpoints = endpoints
        self._first = preferred
        # `end` (time.monotonic()) instead of `budget`: the shards of one fanned-out query
        # share one deadline.
        self._end = time.monotonic() + budget if end is None else end
        self._reason = "disconnected: no endpoints"

    def attempts(self) -> Iterator[Tuple[int, float]]:
        """(endpoint index, timeout in seconds) for each endpoint to try, while time is left."""
        n = len(self.endpoints)
        for k in range(n):
            left = self._end - time.monotonic()
            if left <= 0:
                self._reason = "timeout"
                return
            yield (self._first + k) % n, left / (n - k)

    def failed(self, index: int, error: Exception) -> Optional[MatchResult]:
        """Records why endpoint `index` gave no answer; returns the final result when no other
        endpoint can do better (the request itself was rejected), None to try the next one."""
        endpoint = self.endpoints[index]
        # grpc's sync and aio call errors both have code() and details(); anything else
        # (a broken channel, a bug) is treated as a disconnection.
        if isinstance(error, MuxTooLarge):  # every replica would refuse it: no failover
            return MatchResult("unavailable", reason=f"rejected: {error}", endpoint=endpoint)
        if isinstance(error, MuxError):  # a query over the replica's stream (streaming=True)
            code, details = error.status()
        else:
            code = error.code() if isinstance(error, grpc.RpcError) and hasattr(error, "code") else None
            details = error.details() if code is not None else str(error)  # type: ignore[attr-defined]
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            self._reason = "timeout"
        elif code is None or code in _TRY_NEXT:
            kind = "overloaded" if code == grpc.StatusCode.RESOURCE_EXHAUSTED else "disconnected"
            self._reason = f"{kind}: {endpoint}: {details}"
        else:
            return MatchResult("unavailable", reason=f"rejected: {code.name}: {details}", endpoint=endpoint)
        return None

    def unavailable(self) -> MatchResult:
        """The result when no endpoint answered: the last failure's reason ("timeout" when the
        deadline ran out)."""
        return MatchResult("unavailable", reason=self._reason)


def endpoint_list(endpoints: Sequence[str]) -> List[str]:
    """The endpoints as a list; a lone string is one endpoint, not a sequence of characters."""
    return [endpoints] if isinstance(endpoints, str) else list(endpoints)

"""Discovery seeds: the endpoints a discovering client asks `Describe` (as the Rust client's
client/src/seeds.rs).

A seed names a host, and a name may stand for many replicas: a headless Kubernetes Service (or
any DNS name with several A/AAAA records) resolves to every pod behind it. Asked as one
endpoint, such a name reaches one replica per call -- whichever gRPC's resolver or a Service's
cluster IP picks -- so the shards behind the other addresses stay unknown and answers come back
partial. So before every discovery round each seed's host is resolved (`expand`) and every
address becomes an endpoint of its own. With TLS, an address's certificate is still checked
against the seed's host name (certificates name the service, not a pod's address), unless the
client was given a `server_name`.

The resolver is injectable: `resolver(host, port) -> [ip, ...]`; the system's (getaddrinfo:
/etc/hosts, then DNS) by default.
"""
import ipaddress
import logging
import socket
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

log = logging.getLogger("prefixlog_client")

Resolver = Callable[[str, int], Sequence[str]]


def system_resolver(host: str, port: int) -> List[str]:
    """Every address `host` resolves to (TCP), as strings."""
    return sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


def split(endpoint: str) -> Optional[Tuple[str, int]]:
    """(host, port) of "host:port" or "[v6]:port"; None for anything else (a gRPC target with a
    scheme such as "dns:///..." or "unix:...", which is asked as given)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in endpoint:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return None
    return host, int(port)


def join(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


@dataclass
class Expanded:
    """The endpoints to ask (in the seeds' order, a name's addresses sorted, no duplicates)
    and, for each address a name resolved to, that name (what a TLS certificate is checked
    against)."""

    endpoints: List[str]
    server_names: Dict[str, str] = field(default_factory=dict)


def expand(seeds: Sequence[str], resolver: Resolver) -> Expanded:
    """Every address of every seed, as "address:port". A seed that is an address, not
    "host:port", or whose name does not resolve is kept as it is (its channel resolves it, or
    fails, on use: a resolver hiccup does not empty the seed list)."""
    endpoints: Dict[str, None] = {}  # an ordered set
    names: Dict[str, str] = {}
    for seed in seeds:
        parts = split(seed)
        if parts is None or is_address(parts[0]):
            endpoints[seed] = None
            continue
        host, port = parts
        try:
            addresses = list(resolver(host, port))
        except OSError as e:
            log.warning("discovery seed %s did not resolve (%s); asking it as given", seed, e)
            addresses = []
        if not addresses:
            endpoints[seed] = None
            continue
        for ip in sorted(set(addresses), key=lambda a: ipaddress.ip_address(a) if is_address(a) else a):
            endpoint = join(ip, port)
            endpoints[endpoint] = None
            names[endpoint] = host
    return Expanded(list(endpoints), names)

#!/usr/bin/env python3
"""Free TCP ports for the test legs' listeners: `free_ports.py N` prints N of them.

A port is picked below the kernel's ephemeral range (`ip_local_port_range`) and checked free by
binding it; none is given twice by one process. A port the kernel hands out (bind to 0), or one
inside that range, is free only until an outgoing connection takes it, which on a busy machine
happened between picking it and the server binding it ("Address already in use").
"""

from __future__ import annotations

import random
import socket
import sys

_GIVEN: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except OSError:
        return 32768


def free_port() -> int:
    """One free port, never one this process was given before."""
    lo = _ephemeral_low()
    while True:
        port = random.randrange(max(1024, lo - 12000), lo)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port


if __name__ == "__main__":
    print(*(free_port() for _ in range(int(sys.argv[1]))))

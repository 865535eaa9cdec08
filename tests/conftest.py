import itertools

import pytest

from ampd.serve.state.memory_store import MemoryStore
from ampd.serve.state.redis_store import RedisStore
from redis_server import start_redis

_prefixes = itertools.count()


@pytest.fixture(scope="session")
def redis_server():
    """A real Redis server shared by the tests of one session (each test uses its own key prefix)."""
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture(params=["memory", "redis"])
def make_store(request):
    """Makes the store under test: the in-memory one, then a ``RedisStore`` on
    the shared server under a key prefix of its own."""
    def make():
        if request.param == "memory":
            return MemoryStore(window_s=10.0)
        url = request.getfixturevalue("redis_server").url
        return RedisStore(url, window_s=10.0, prefix=f"store{next(_prefixes)}:")
    return make

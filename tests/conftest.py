import pytest

from redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server():
    """A real Redis server shared by the tests of one session (each test uses its own key prefix)."""
    server = RedisServer().start()
    yield server
    server.stop()

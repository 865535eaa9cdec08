import pytest

from redis_server import start_redis


@pytest.fixture(scope="session")
def redis_server():
    """A real Redis server shared by the tests of one session (each test uses its own key prefix)."""
    server = start_redis()
    yield server
    server.stop()

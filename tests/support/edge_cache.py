"""The `edge_cache` fixture: nginx in front of an origin, as the CloudFront distribution of issue 39 would be
(infra/local/edge_cache.py says how it caches). Outside CI the tests that use it skip where nginx is not installed; in
CI (.ci/run installs it) they fail instead."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from infra.local.edge_cache import LINE_PATHS, EdgeCache, nginx_binary


def require_nginx() -> None:
    """Skip the test where nginx is not installed; fail it in CI."""
    if nginx_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is not installed: .ci/run installs it, and CI must run the edge cache's tests")
        pytest.skip("nginx is not installed (apt-get install nginx)")


@pytest.fixture
def edge_cache() -> Iterator[Callable[..., EdgeCache]]:
    """Start an EdgeCache in front of an origin: `edge_cache(origin_url, cached_paths=...)`; stopped after the test.
    Skips where nginx is not installed, fails instead in CI."""
    require_nginx()
    started: list[EdgeCache] = []

    def start(origin_url: str, cached_paths: str = LINE_PATHS) -> EdgeCache:
        started.append(EdgeCache(origin_url, cached_paths=cached_paths).start())
        return started[-1]

    yield start
    for cache in started:
        cache.stop()

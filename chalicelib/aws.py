"""The AWS clients of the functions, each built once with timeouts and bounded retries.

botocore's defaults (60 s connect and read timeouts, several retries) let one call to an endpoint that
accepts and never answers (a missing NAT gateway or VPC endpoint) hold a request past API Gateway's 29 s.
Nothing on a request's path waits for these calls anyway (refreshes run in the background, see refresh.py):
the limits bound the cold start that must load the signing keys, and how long a background refresh holds on.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import boto3
from botocore.config import Config

# At most two attempts of (1 s to connect + 2 s to answer): a dead endpoint costs at most about 6 s.
CLIENT_CONFIG = Config(connect_timeout=1, read_timeout=2, retries={"mode": "standard", "total_max_attempts": 2})


# The services the functions call.
Service = Literal["appconfigdata", "secretsmanager", "events"]


@functools.cache
def client(service: Service) -> Any:
    """The one boto3 client of `service` (e.g. "appconfigdata", "secretsmanager") in this container."""
    return boto3.session.Session().client(service, config=CLIENT_CONFIG)


@functools.cache
def secrets() -> Any:
    """Powertools' Secrets Manager provider (with its cache) over the bounded client."""
    from aws_lambda_powertools.utilities.parameters import SecretsProvider

    return SecretsProvider(boto3_client=client("secretsmanager"))


def reset() -> None:
    """Forget the clients, so the next use reads the environment again (tests)."""
    client.cache_clear()
    secrets.cache_clear()

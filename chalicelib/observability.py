"""Logger, Metrics and Tracer, created once here and imported everywhere (Powertools).

Logs are JSON; metrics are CloudWatch EMF in namespace `VirtualQueue`. Never log a token, a ticket or a key.
"""

import json
import logging
import os
import time
import warnings
from collections.abc import Callable
from contextvars import ContextVar, Token

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging.lambda_context import build_lambda_context_model
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

SERVICE = "virtual-queue"
NAMESPACE = "VirtualQueue"

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
# The authorizer emits a metric only when it denies: an Allow flushing nothing is normal, not worth a warning.
warnings.filterwarnings("ignore", message="No application metrics to publish")
# Building a Tracer imports the X-Ray SDK, which creates boto3 clients (a third of a cold start), and each
# request then passes through a segment even when tracing is off: with tracing switched off by Powertools'
# own POWERTOOLS_TRACE_DISABLED there is no Tracer at all. The functions' tracing mode is PassThrough (Chalice's
# default: no "xray" in .chalice/config.json), where nothing records segments, so config.json switches it off;
# whoever sets "xray": true (Tracing: Active) removes that line (tests/test_stack_hygiene.py holds them together).
_TRACE_DISABLED = os.environ.get("POWERTOOLS_TRACE_DISABLED", "").lower() in ("1", "y", "yes", "t", "true", "on")
tracer = None if _TRACE_DISABLED else Tracer(service=SERVICE)


# The keys of the request being answered (correlation id, target, user id). Kept aside and added to a record only
# when a line is written: most requests write none, and Powertools' clear_state and append_keys on every request
# cost more than the rest of the logging. Per context, so concurrent requests (a threaded local server) keep theirs.
_REQUEST_KEYS: ContextVar[dict | None] = ContextVar("request_log_keys", default=None)


def open_request_keys(**keys: object) -> Token:
    """Start a request's log keys; hand the result to `close_request_keys` when it is answered."""
    return _REQUEST_KEYS.set(keys)


def close_request_keys(token: Token) -> None:
    _REQUEST_KEYS.reset(token)


def add_request_keys(**keys: object) -> None:
    """Keys every line the current request writes will carry (nothing outside a request)."""
    current = _REQUEST_KEYS.get()
    if current is not None:
        current.update(keys)


def lambda_context_keys(context: object) -> dict[str, object]:
    """The Lambda context's fields, as Powertools' inject_lambda_context adds them to every line."""
    return vars(build_lambda_context_model(context))


class _RequestKeys(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # A line's own `extra` wins; values are JSON-encoded by Powertools (str() for a Target).
        for name, value in (_REQUEST_KEYS.get() or {}).items():
            record.__dict__.setdefault(name, value)
        return True


logger.addFilter(_RequestKeys())

# With a target, a metric is filed both per target and for the whole service, so alarms can watch
# every target without knowing them (CloudWatch alarms cannot search for dimension values).
_PER_TARGET = [["target", "service"], ["service"]]
_METRICS_DISABLED = is_metrics_disabled()
_SERVICE_ONLY = [["service"]]


def count(name: str, target: object = None, value: float = 1, unit: MetricUnit = MetricUnit.Count) -> None:
    """Emit one value of `name` (a Count of 1 unless told) as one EMF line, per `target` when known and per service.

    Flushed on the spot, so it also works where no `log_metrics` wraps the code (Chalice routes). Written
    by hand: Powertools' single_metric takes one dimension set only and costs three times as much. Like
    Powertools, it stays silent under POWERTOOLS_METRICS_DISABLED (or POWERTOOLS_DEV).
    """
    if _METRICS_DISABLED:
        return
    dimensions = {"service": SERVICE} if target is None else {"target": str(target), "service": SERVICE}
    directive = {
        "Namespace": NAMESPACE,
        "Dimensions": _SERVICE_ONLY if target is None else _PER_TARGET,
        "Metrics": [{"Name": name, "Unit": unit.value}],
    }
    emf = {"_aws": {"Timestamp": int(time.time() * 1000), "CloudWatchMetrics": [directive]}, **dimensions, name: value}
    print(json.dumps(emf, separators=(",", ":")))


class Tally:
    """A count too frequent to file per request (a line of log each): added up in the container and filed as one
    value of `name` at most every `every_s`, the first at once. What a container counted after its last filing
    is lost with it; the signal is "any in this minute", not an exact sum."""

    def __init__(self, name: str, every_s: float = 60, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._every_s = every_s
        self._clock = clock
        self._counted = 0
        self._due = float("-inf")

    def add(self, n: int = 1) -> None:
        self._counted += n
        now = self._clock()
        if now >= self._due:
            count(self.name, value=self._counted)
            self._counted, self._due = 0, now + self._every_s

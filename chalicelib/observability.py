"""Logger, Metrics and Tracer, created once here and imported everywhere (Powertools).

Logs are JSON; metrics are CloudWatch EMF in namespace `VirtualQueue`. Never log a token, a ticket or a key.
"""

import json
import os
import time
import warnings

from aws_lambda_powertools import Logger, Metrics, Tracer
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
# own POWERTOOLS_TRACE_DISABLED there is no Tracer at all.
_TRACE_DISABLED = os.environ.get("POWERTOOLS_TRACE_DISABLED", "").lower() in ("1", "y", "yes", "t", "true", "on")
tracer = None if _TRACE_DISABLED else Tracer(service=SERVICE)


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

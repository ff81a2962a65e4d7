"""Logger, Metrics and Tracer, created once here and imported everywhere (Powertools).

Logs are JSON; metrics are CloudWatch EMF in namespace `VirtualQueue`. Never log a token, a ticket or a key.
"""

import warnings

from aws_lambda_powertools import Logger, Metrics, Tracer, single_metric
from aws_lambda_powertools.metrics import MetricUnit

SERVICE = "virtual-queue"
NAMESPACE = "VirtualQueue"

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
# The authorizer emits a metric only when it denies: an Allow flushing nothing is normal, not worth a warning.
warnings.filterwarnings("ignore", message="No application metrics to publish")
tracer = Tracer(service=SERVICE)


def count(name: str, target: object = None, value: float = 1, unit: MetricUnit = MetricUnit.Count) -> None:
    """Emit one value of `name` (a Count of 1 unless told), with a `target` dimension when known.

    Flushed on the spot, so it also works where no `log_metrics` wraps the code (Chalice routes).
    """
    with single_metric(name=name, unit=unit, value=value, namespace=NAMESPACE) as metric:
        if target is not None:
            metric.add_dimension(name="target", value=str(target))

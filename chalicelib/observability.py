"""Logger, Metrics and Tracer, created once here and imported everywhere (Powertools).

Logs are JSON; metrics are CloudWatch EMF in namespace `VirtualQueue`. Never log a token, a ticket or a key.
"""

from aws_lambda_powertools import Logger, Metrics, Tracer

SERVICE = "virtual-queue"
NAMESPACE = "VirtualQueue"

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
tracer = Tracer(service=SERVICE)

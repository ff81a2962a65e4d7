"""What the code under test emitted: CloudWatch EMF metrics (JSON lines on stdout) and Powertools log lines."""

import io
import json

import pytest

from chalicelib.observability import logger


def emitted(stdout: str) -> list[tuple[str, dict]]:
    """Every metric in `stdout` as (name, dimensions), in order."""
    found = []
    for line in stdout.splitlines():
        if not line.startswith('{"_aws"'):
            continue
        record = json.loads(line)
        for directive in record["_aws"]["CloudWatchMetrics"]:
            assert directive["Namespace"] == "VirtualQueue"
            dimensions = {name: record[name] for names in directive["Dimensions"] for name in names}
            found += [(metric["Name"], dimensions) for metric in directive["Metrics"]]
    return found


def counted(stdout: str, name: str) -> list[dict]:
    """The dimensions of each emission of metric `name` in `stdout`."""
    return [dimensions for metric, dimensions in emitted(stdout) if metric == name]


@pytest.fixture
def log_lines(monkeypatch):
    """The JSON lines the Powertools logger writes from now on (its stream is bound at import, past capsys)."""
    stream = io.StringIO()
    monkeypatch.setattr(logger.registered_handler, "stream", stream)
    return lambda: [json.loads(line) for line in stream.getvalue().splitlines()]

"""The runtime switch of the queue: Powertools FeatureFlags over AppConfig (deployed) or a JSON file (local).

Flag `virtual_queue_enabled`, evaluated with the context `{"target": "limited-drop:42", "type":
"limited-drop", "user_id": 7}`: its rules give per-target overrides (`KEY_IN_VALUE` on `target`) and a
percentage rollout by user id (`MODULO_RANGE` on `user_id`), first matching rule wins. `infra/flags.json`
is the schema's example and the local default.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from aws_lambda_powertools.utilities.feature_flags import FeatureFlags
from aws_lambda_powertools.utilities.feature_flags.base import StoreProvider
from aws_lambda_powertools.utilities.feature_flags.exceptions import ConfigurationStoreError

from chalicelib.observability import logger
from chalicelib.targets import Target

FLAG = "virtual_queue_enabled"


class JsonFileStore(StoreProvider):
    """Flag configuration from a local JSON file, read again whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._configuration: dict[str, Any] = {}

    @property
    def get_raw_configuration(self) -> dict[str, Any]:
        try:
            stat = os.stat(self.path)
            if (stat.st_mtime_ns, stat.st_size) != self._seen:
                self._configuration = json.loads(self.path.read_text())
                self._seen = (stat.st_mtime_ns, stat.st_size)
        except (OSError, ValueError) as err:
            raise ConfigurationStoreError(f"cannot read flags from {self.path}: {err}") from err
        return self._configuration

    def get_configuration(self) -> dict[str, Any]:
        return self.get_raw_configuration


class QueueSwitch:
    """Whether a user of a target goes through the queue; a store or schema error answers `default`."""

    def __init__(self, flags: FeatureFlags, default: bool) -> None:
        self._flags = flags
        self.default = default

    def queue_enabled(self, target: Target, user_id: int | None = None) -> bool:
        context: dict[str, Any] = {"target": str(target), "type": target.type}
        if user_id is not None:
            context["user_id"] = user_id
        try:
            return bool(self._flags.evaluate(name=FLAG, context=context, default=self.default))
        except Exception:  # a malformed schema raises; the switch must still answer
            logger.exception("feature flag evaluation failed; using the default", extra={"default": self.default})
            return self.default


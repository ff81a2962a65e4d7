"""The runtime switch of the queue: Powertools FeatureFlags over AppConfig (deployed) or a JSON file (local).

Flag `virtual_queue_enabled`, evaluated with the context `{"target": "limited-drop:42", "type":
"limited-drop", "user_id": 8310461276254307583}`: its rules give per-target overrides (`KEY_IN_VALUE` on
`target`) and a percentage rollout by user (`MODULO_RANGE` on `user_id`), first matching rule wins. User ids
are opaque strings and MODULO_RANGE needs an integer, so `user_id` is the user's bucket number: the first 8
bytes of SHA-256 of the verified user id, big-endian (`bucket`). `infra/flags.json` is the schema's example
and the local default.

Two routes bring a new configuration to a container (docs/architecture.md: the feature flag's two routes):
- its source: AppConfig polled honestly, never faster than the session's minimum interval (15 s), or the
  local file, read again when it changes;
- the queue's store, within a few seconds: an AppConfig extension runs `flag_sync` on every deployment,
  which stores the configuration and marks each target's settings with its version (flag_sync.py). The
  enter and status scripts compare that mark with the version the caller decided by, and ask it to look
  again when they differ (`QueueSwitch.adopt`), inside the round trip they make anyway.
A container decides by the configuration it received last, from either route. While the flag's rules read
nothing but the target, a target's decision is made once per configuration and kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_lambda_powertools.utilities.feature_flags import FeatureFlags
from aws_lambda_powertools.utilities.feature_flags.base import StoreProvider
from aws_lambda_powertools.utilities.feature_flags.exceptions import ConfigurationStoreError
from botocore.exceptions import BotoCoreError, ClientError

from chalicelib.observability import logger
from chalicelib.refresh import BackgroundRefresh
from chalicelib.targets import Target

FLAG = "virtual_queue_enabled"
# The version of "no configuration at hand" (the flag answers its default).
NO_CONFIGURATION = "none"
# Context keys that are the same for every user of a target: rules reading only these decide per target.
TARGET_KEYS = frozenset({"target", "type"})
# Decisions kept per configuration, at most: a request names its target before anything checks that it exists,
# so a caller naming ever new ids would otherwise grow the container's memory without end. Past it they start afresh.
DECISIONS_KEPT = 4096


def flag_version(configuration: dict[str, Any]) -> str:
    """A short digest of `configuration`: the same on both routes for the same content."""
    canonical = json.dumps(configuration, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


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


class AppConfigSession(StoreProvider):
    """The flag's configuration from AppConfig Data, polled honestly and never on a request's time.

    A session's minimum poll interval (`RequiredMinimumPollIntervalInSeconds`, 15 to 86,400 s, 60 s when
    unset) is set here, and `GetLatestConfiguration` called sooner answers BadRequestException "Request too
    early"; each configuration token is good for one call; an empty `Configuration` means "unchanged". So
    the next poll waits at least the interval, and at least what the service answers in
    `NextPollIntervalInSeconds`, counted from the end of the last call. Any error (too early, an expired
    token, a timeout) keeps the last configuration and starts a new session one interval later.

    Polls run in the background (refresh.py): a request reads the last known configuration. Only a cold
    start, with none in hand yet, waits for the first one, at most `first_wait_s`.
    """

    def __init__(
        self,
        application: str,
        environment: str,
        profile: str,
        client: Any,
        poll_interval_s: int = 15,
        clock: Callable[[], float] = time.monotonic,
        first_wait_s: float = 0.1,
    ) -> None:
        self._identifiers = {
            "ApplicationIdentifier": application,
            "EnvironmentIdentifier": environment,
            "ConfigurationProfileIdentifier": profile,
        }
        self.poll_interval_s = poll_interval_s
        self._client = client
        self._clock = clock
        self._first_wait_s = first_wait_s
        self._token: str | None = None
        self._configuration: dict[str, Any] | None = None
        self._next_poll = float("-inf")
        self._refresh = BackgroundRefresh(self.poll, "appconfig-poll")

    @property
    def get_raw_configuration(self) -> dict[str, Any]:
        return self.get_configuration()

    def get_configuration(self) -> dict[str, Any]:
        if self._clock() >= self._next_poll:
            self._next_poll = self._clock() + self.poll_interval_s  # the poll itself sets the real time
            self._refresh.start()
            if self._configuration is None:
                self._refresh.wait(self._first_wait_s)
        if self._configuration is None:
            raise ConfigurationStoreError("no flag configuration received from AppConfig yet")
        return self._configuration

    def poll(self) -> None:
        """One GetLatestConfiguration (and StartConfigurationSession first, when there is no session)."""
        client = self._client
        try:
            if self._token is None:
                session = client.start_configuration_session(
                    **self._identifiers,
                    RequiredMinimumPollIntervalInSeconds=self.poll_interval_s,
                )
                self._token = session["InitialConfigurationToken"]
            answer = client.get_latest_configuration(ConfigurationToken=self._token)
            content = answer["Configuration"].read()
        except (BotoCoreError, ClientError) as err:
            self._token = None
            self._next_poll = self._clock() + self.poll_interval_s
            reason = err.response["Error"].get("Message", "") if isinstance(err, ClientError) else ""
            logger.warning(
                "flag configuration not refreshed; keeping the last one",
                extra={"error": type(err).__name__, "reason": reason[:200]},
            )
            return
        self._token = answer["NextPollConfigurationToken"]
        self._next_poll = self._clock() + max(self.poll_interval_s, answer.get("NextPollIntervalInSeconds", 0))
        if content:
            try:
                self._configuration = json.loads(content)
            except ValueError:
                logger.error("flag configuration from AppConfig is not JSON; keeping the last one")


def bucket(user_id: str) -> int:
    """The number a percentage rollout sorts `user_id` by: stable, and spread evenly whatever the ids look like."""
    return int.from_bytes(hashlib.sha256(user_id.encode()).digest()[:8], "big")


@dataclass(frozen=True)
class Decision:
    """Whether a user goes through the queue, and the version of the flag configuration that said so."""

    queued: bool
    flag_version: str


# Queue, whatever flag version the target carries (callers below the switch: the pump's tests, benchmarks).
QUEUED = Decision(True, "*")


def _per_target(configuration: dict[str, Any]) -> bool:
    """Whether the flag's rules read only the target, so that one decision serves all its users (a rollout by
    user id, a schedule or a malformed rule is evaluated per request)."""
    try:
        rules = configuration.get(FLAG, {}).get("rules") or {}
        return all(
            condition.get("key") in TARGET_KEYS for rule in rules.values() for condition in rule.get("conditions") or ()
        )
    except AttributeError:
        return False


class _InEffect(StoreProvider):
    """The configuration a container decides by (what FeatureFlags evaluates), and the decisions made by it
    per target when its rules allow (a new configuration starts them afresh)."""

    def __init__(self) -> None:
        self.configuration: dict[str, Any] | None = None
        self.version = NO_CONFIGURATION
        self.decided: dict[Target, Decision] | None = None

    def put(self, configuration: dict[str, Any], version: str | None = None) -> None:
        self.configuration = configuration
        self.version = version or flag_version(configuration)
        self.decided = {} if _per_target(configuration) else None

    @property
    def get_raw_configuration(self) -> dict[str, Any]:
        return self.get_configuration()

    def get_configuration(self) -> dict[str, Any]:
        if self.configuration is None:
            raise ConfigurationStoreError("no flag configuration at hand")
        return self.configuration


class QueueSwitch:
    """Whether a user of a target goes through the queue, by the last configuration received from `source`
    or pushed through the queue's store (`adopt`); no configuration, or a malformed one, answers `default`."""

    def __init__(self, source: StoreProvider, default: bool) -> None:
        self.source = source
        self.default = default
        self._from_source: dict[str, Any] | None = None
        self._in_effect = _InEffect()
        self._flags = FeatureFlags(store=self._in_effect)

    def queue_enabled(self, target: Target, user_id: str | None = None) -> bool:
        return self.decide(target, user_id).queued

    def decide(self, target: Target, user_id: str | None = None) -> Decision:
        """The decision for `user_id` (None: not known) of `target`, with the version it was made by."""
        self._follow_source()
        in_effect = self._in_effect
        decided = in_effect.decided
        if decided is not None and target in decided:
            return decided[target]
        context: dict[str, Any] = {"target": str(target), "type": target.type}
        if user_id is not None:
            context["user_id"] = bucket(user_id)
        try:
            queued = bool(self._flags.evaluate(name=FLAG, context=context, default=self.default))
        except Exception:  # a malformed schema raises; the switch must still answer
            logger.exception("feature flag evaluation failed; using the default", extra={"default": self.default})
            return Decision(self.default, in_effect.version)
        decision = Decision(queued, in_effect.version)
        if decided is not None:
            if len(decided) >= DECISIONS_KEPT:
                decided.clear()
            decided[target] = decision
        return decision

    def adopt(self, version: str, configuration: dict[str, Any]) -> None:
        """Decide by `configuration` (pushed through the queue's store) until the source brings a newer one."""
        self._in_effect.put(configuration, version)

    def _follow_source(self) -> None:
        try:
            configuration = self.source.get_configuration()
        except ConfigurationStoreError:
            return  # keep what is in effect (the default, when nothing ever came)
        # Sources hand back the same object until their content changes: a new object is news.
        if configuration is not self._from_source:
            self._from_source = configuration
            self._in_effect.put(configuration)

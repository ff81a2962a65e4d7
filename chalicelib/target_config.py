"""Per-target configuration set by operators at run time (`PUT` or `PATCH /virtual-queues/{type}/{id}/config`).

Every field is optional; an unset one falls back to the global default of chalicelib/config.py. The
API spells fields in camelCase and times as ISO-8601 with a zone; Redis keeps them as integers
(`Redis fields` below), which the Lua scripts read directly. The display fields (`displayName`,
`imageUrl`) are text for the waiting-room page only; the scripts never read them.

Besides the pace and the schedule, an operator steers a sale with `paused` (no admissions, everyone keeps
their place), `soldOut` (nobody is admitted and everyone still waiting is told so; the shop can set it too),
`inviteOnly` (only callers whose verified JWT invites them to the target may enter: identity.py),
`originSlo` (the pump lowers the rate while the shop misses the objective: see shop_health.py) and `safetyNet`
(while nobody waits, enter admits at once within the rate: lua/budget.lua).

A PUT body is the whole configuration; a PATCH body is a JSON Merge Patch (RFC 7396) of it, validated as the
PUT body it makes. `Precondition` is what a write expects of the stored configuration's version (`If-Match`,
`If-None-Match`); the store checks it in the same step as the write.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from chalicelib.errors import InvalidArgument

MAX_BODY_BYTES = 4096
# Most sub-lines one target's line may span (docs/sharding.md).
MAX_SHARDS = 64
# API name -> (Redis field, lowest, highest) for the integer fields.
_LIMITS = {
    "batch": ("batch", 1, 100_000),
    "tickMs": ("tick_ms", 100, 60_000),
    "maxWaiting": ("max_waiting", 1, 10_000_000),
    "maxActive": ("max_active", 1, 10_000_000),
    "shards": ("shards", 1, MAX_SHARDS),
}
_TIMES = {"opensAt": "opens_at_ms", "closesAt": "closes_at_ms"}
# API name -> (Redis field, longest) for the display texts the page shows.
_TEXTS = {"displayName": ("display_name", 80), "imageUrl": ("image_url", 500)}
_FLAGS = {"paused": "paused", "soldOut": "sold_out", "inviteOnly": "invite_only", "safetyNet": "safety_net"}
# originSlo's fields: API name -> (Redis field, type, lowest, highest).
_SLO = {"p95Ms": ("slo_p95_ms", int, 1, 60_000), "errorRate": ("slo_error_rate", float, 0.0, 1.0)}
# Every field a body may name.
_FIELDS = frozenset((*_LIMITS, *_TIMES, *_TEXTS, *_FLAGS, "originSlo"))
# An ETag as the API answers it: a quoted SHA-1 of the stored configuration (chalicelib/store.py).
_ETAG = re.compile(r'"([0-9a-f]{40})"')
MAX_PRECONDITION_CHARS = 1000
_ISO_8601 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-5][0-9])"
)
_FIRST_YEAR, _LAST_YEAR = 2000, 2099
# https, a host name (no credentials, no address in brackets), a port if any, then the characters RFC 3986 allows
# in a URL (percent-encode the rest), without quotes. infra/openapi.yaml's pattern is the same.
_IMAGE_URL = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?([/?#][A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]*)?")


@dataclass(frozen=True)
class TargetConfig:
    """One target's own settings; None means the global default applies."""

    batch: int | None = None
    tick_ms: int | None = None
    max_waiting: int | None = None
    max_active: int | None = None
    opens_at_ms: int | None = None
    closes_at_ms: int | None = None
    display_name: str | None = None
    image_url: str | None = None
    paused: bool = False
    sold_out: bool = False
    invite_only: bool = False  # enter needs a verified invite naming the target (docs/identity.md)
    safety_net: bool = False  # while nobody waits, enter admits at once within the rate (docs/safety-net.md)
    slo_p95_ms: int | None = None  # originSlo
    slo_error_rate: float | None = None
    shards: int | None = None  # sub-lines the line spans, each on its own hash tag (docs/sharding.md); None: 1

    @property
    def shard_count(self) -> int:
        """How many sub-lines the line spans."""
        return self.shards or 1

    @property
    def follows_origin(self) -> bool:
        """Whether the pump adjusts this target's rate to the shop's health (an originSlo is set)."""
        return self.slo_p95_ms is not None or self.slo_error_rate is not None

    def display(self) -> dict[str, str]:
        """The display fields that are set, as the API names them."""
        return {api_name: getattr(self, name) for api_name, (name, _) in _TEXTS.items() if getattr(self, name)}

    def to_redis(self) -> dict[str, int | float | str]:
        """The set fields, as stored in the target's `config` hash (flags as 1, absent when off)."""
        stored: dict[str, int | float | str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value is not False:
                stored[f.name] = int(value) if isinstance(value, bool) else value
        return stored

    @classmethod
    def from_redis(cls, stored: dict[str, str]) -> TargetConfig:
        def read(name: str, text: str) -> int | float | bool | str:
            if name in _FLAGS.values():
                return text == "1"
            if name in (field for field, _ in _TEXTS.values()):
                return text
            return float(text) if name == "slo_error_rate" else int(text)

        values: dict[str, Any] = {f.name: read(f.name, stored[f.name]) for f in fields(cls) if f.name in stored}
        return cls(**values)

    def to_body(self, all_flags: bool = False) -> dict:
        """The API's spelling; `paused` and `soldOut` only when on, unless `all_flags`."""
        body: dict = {}
        for api_name, (name, _, _) in _LIMITS.items():
            if getattr(self, name) is not None:
                body[api_name] = getattr(self, name)
        for api_name, name in _TIMES.items():
            if getattr(self, name) is not None:
                body[api_name] = iso_time(getattr(self, name))
        for api_name, name in _FLAGS.items():
            if all_flags or getattr(self, name):
                body[api_name] = getattr(self, name)
        slo = {
            api_name: getattr(self, name)
            for api_name, (name, _, _, _) in _SLO.items()
            if getattr(self, name) is not None
        }
        if slo:
            body["originSlo"] = slo
        return body | self.display()


def iso_time(epoch_ms: int) -> str:
    """`epoch_ms` as ISO-8601 UTC with milliseconds, e.g. 2026-12-01T11:00:00.000Z."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Precondition:
    """What an operator's write expects of the stored configuration: one of `etags` (If-Match), any version
    (`If-Match: *`: the target is open), or none at all (`If-None-Match: *`: the target is not open yet)."""

    etags: tuple[str, ...] = ()
    any_version: bool = False
    absent: bool = False
    given: bool = False  # an If-Match was sent (an empty or unmatchable list matches nothing)

    @classmethod
    def parse(cls, if_match: str | None, if_none_match: str | None) -> Precondition:
        """The precondition of `If-Match` and `If-None-Match` (either may be absent); InvalidArgument if malformed.
        Comparison is strong (RFC 9110): a weak `W/"..."` ETag never matches."""
        for name, text in (("If-Match", if_match), ("If-None-Match", if_none_match)):
            if text is not None and len(text) > MAX_PRECONDITION_CHARS:
                raise InvalidArgument(f"{name} is longer than {MAX_PRECONDITION_CHARS} characters")
        if if_none_match is not None and if_none_match.strip() != "*":
            raise InvalidArgument('If-None-Match takes only "*" here (the target must not be open yet)')
        if if_match is None:
            return cls(absent=True) if if_none_match is not None else cls()
        if if_none_match is not None:
            _etags(if_match)  # checked all the same
            # RFC 9110 asks If-Match first, then If-None-Match: an open target fails the one, any other the
            # other, so both at once never hold (412, or 404 for a target not open, as If-Match alone).
            return cls(given=True)
        if if_match.strip() == "*":
            return cls(any_version=True, given=True)
        return cls(etags=_etags(if_match), given=True)

    def allows(self, etag: str | None) -> bool:
        """Whether a target whose configuration has version `etag` (None: not open) meets this precondition."""
        if self.absent:
            return etag is None
        if not self.given:
            return True
        return etag is not None and (self.any_version or etag in self.etags)


# A write that expects nothing of the stored version.
UNCONDITIONAL = Precondition()


def _json_object(raw_body: bytes | None) -> dict:
    if not raw_body or len(raw_body) > MAX_BODY_BYTES:
        raise InvalidArgument(f"the body must be a JSON object of at most {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(raw_body)
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("the body is not valid JSON") from None
    except RecursionError:
        raise InvalidArgument("the body is nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidArgument("the body must be a JSON object")
    return body


def parse_config(raw_body: bytes | None) -> TargetConfig:
    """The configuration a PUT body describes; InvalidArgument for anything malformed, unknown or out of range."""
    return config_of(_json_object(raw_body))


def parse_patch(raw_body: bytes | None) -> dict:
    """A PATCH body: a JSON Merge Patch of the configuration, naming known fields only (checked in full once
    merged, by `merge_patch`)."""
    patch = _json_object(raw_body)
    _refuse_unknown(patch)
    slo = patch.get("originSlo")
    if isinstance(slo, dict) and set(slo) - set(_SLO):
        raise InvalidArgument(f"originSlo takes only {', '.join(_SLO)}")
    return patch


def merge_patch(own: TargetConfig, patch: dict) -> TargetConfig:
    """`own` with `patch` merged in (RFC 7396: a null removes a field, an object merges into the object it
    names), validated as a PUT body. An originSlo left without objectives is removed: the pump stops following."""
    merged = _merged(own.to_body(), patch)
    if merged.get("originSlo") == {}:
        del merged["originSlo"]
    return config_of(merged)


def _merged(current: object, patch: object) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(current) if isinstance(current, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = _merged(result.get(name), value)
    return result


def _refuse_unknown(body: dict) -> None:
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise InvalidArgument(f"unknown fields: {', '.join(unknown)[:200]}")


def config_of(body: dict) -> TargetConfig:
    """The configuration a JSON object describes in the API's spelling; InvalidArgument as `parse_config`."""
    _refuse_unknown(body)
    values: dict[str, Any] = {}  # each value checked against its field below
    for api_name, (name, lowest, highest) in _LIMITS.items():
        if api_name in body:
            value = body[api_name]
            if type(value) is not int or not lowest <= value <= highest:
                raise InvalidArgument(f"{api_name} must be an integer from {lowest} to {highest}")
            values[name] = value
    for api_name, name in _TIMES.items():
        if api_name in body:
            values[name] = _epoch_ms(api_name, body[api_name])
    if "displayName" in body:
        values["display_name"] = _display_name(body["displayName"])
    if "imageUrl" in body:
        values["image_url"] = _image_url(body["imageUrl"])
    for api_name, name in _FLAGS.items():
        if api_name in body:
            if type(body[api_name]) is not bool:
                raise InvalidArgument(f"{api_name} must be true or false")
            values[name] = body[api_name]
    if "originSlo" in body:
        values.update(_origin_slo(body["originSlo"]))
    config = TargetConfig(**values)
    if config.opens_at_ms is not None and config.closes_at_ms is not None and config.closes_at_ms <= config.opens_at_ms:
        raise InvalidArgument("closesAt must be after opensAt")
    if config.shard_count > 1 and config.safety_net:
        # A newcomer's sub-line cannot see whether anyone waits in the others (docs/sharding.md).
        raise InvalidArgument("safetyNet needs shards 1: a sharded line has no single front to pass through")
    return config


def _origin_slo(slo: object) -> dict[str, int | float]:
    if not isinstance(slo, dict) or not slo or set(slo) - set(_SLO):
        raise InvalidArgument(
            'originSlo must be an object with p95Ms and/or errorRate, e.g. {"p95Ms": 800, "errorRate": 0.05}'
        )
    values: dict[str, int | float] = {}
    for api_name, (name, kind, lowest, highest) in _SLO.items():
        if api_name in slo:
            value = slo[api_name]
            numeric = type(value) is int or (kind is float and type(value) is float)
            if not numeric or not lowest <= value <= highest:
                raise InvalidArgument(f"originSlo.{api_name} must be a {kind.__name__} from {lowest} to {highest}")
            values[name] = kind(value)
    return values


def _etags(if_match: str) -> tuple[str, ...]:
    """The strong ETags of an If-Match header (`*` names none); InvalidArgument if it is malformed."""
    if if_match.strip() == "*":
        return ()
    items = [item.strip() for item in if_match.split(",")]
    if not all(re.fullmatch(r'(W/)?"[\x21\x23-\x7e]*"', item) for item in items):
        raise InvalidArgument('If-Match must be "*" or ETags as GET .../config answered them, e.g. "3f2a..."')
    return tuple(m[1] for item in items if (m := _ETAG.fullmatch(item)))


def _epoch_ms(api_name: str, value: object) -> int:
    if not isinstance(value, str) or not _ISO_8601.fullmatch(value):
        raise InvalidArgument(f"{api_name} must be an ISO-8601 time with a zone, e.g. 2026-12-01T11:00:00Z")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(f"{api_name} is not a real time") from None
    # The year as written, whatever the zone, so the API's pattern (infra/openapi.yaml) can say exactly what holds.
    if not _FIRST_YEAR <= moment.year <= _LAST_YEAR:
        raise InvalidArgument(f"{api_name} must be in the years {_FIRST_YEAR} to {_LAST_YEAR}")
    return round(moment.timestamp() * 1000)


def _display_name(value: object) -> str:
    longest = _TEXTS["displayName"][1]
    if not isinstance(value, str) or not value.strip() or len(value) > longest:
        raise InvalidArgument(f"displayName must be text of 1 to {longest} characters")
    # Control, format (bidi overrides could reverse what shoppers read) and unassigned characters.
    if any(unicodedata.category(c) in {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"} for c in value):
        raise InvalidArgument("displayName must not hold control, format or unassigned characters")
    return value.strip()


def _image_url(value: object) -> str:
    longest = _TEXTS["imageUrl"][1]
    if not isinstance(value, str) or len(value) > longest:
        raise InvalidArgument(f"imageUrl must be an https URL of at most {longest} URL characters")
    if not _IMAGE_URL.fullmatch(value):
        raise InvalidArgument("imageUrl must be an https URL: a host name, a port if any, URL characters after it")
    return value

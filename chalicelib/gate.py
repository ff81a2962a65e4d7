"""Who may reach a purchase route: the one verification shared by the REQUEST authorizer and the routes.

Deployed, API Gateway runs `purchase_authorizer` before the route; `chalice local` and the test client
run no custom authorizer, so the routes apply the same `check_entry` themselves. The caller is who
identity.py says (X-User-Id, or the user of a verified JWT), and a token buys only for the user it was
issued to. Nothing here touches Redis or raises on client input: every doubt is a denial, unless the
queue is switched off for the caller (the feature flag), which is asked only when there is no valid token,
so a valid one costs nothing. A caller the identity provider's JWT does not vouch for is told so (401),
and keys that cannot be had are a dependency failure (503), not a denial.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from chalicelib.errors import InvalidArgument, QueueUnavailable, SigningKeysUnavailable, Unauthenticated
from chalicelib.identity import Identity
from chalicelib.targets import TARGET_TYPES, Target, TargetType, parse_positive_id
from chalicelib.tokens import EntryToken, TokenSigner

# The headers the authorizer reads: the token, and whichever the identity reads.
_ENTRY_HEADERS = ("x-entry-token", "x-user-id", "authorization")

# arn:aws:execute-api:{region}:{account}:{apiId}/{stage}/POST/{path}: only a POST to a purchase path.
_ARN_HEAD = r"arn:aws[a-z-]*:execute-api:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9]+/[A-Za-z0-9_-]+/POST"


def _path_pattern(kind: TargetType) -> str:
    before, after = kind.purchase_path.split("{" + kind.id_parameter + "}")
    return re.escape(before) + "([^/]+)" + re.escape(after)


# One alternative per purchase route (the target types' own): the number of the group that matched tells the type.
_ROUTE_TYPES = list(TARGET_TYPES)
_ROUTE_ARN = re.compile(_ARN_HEAD + "(?:" + "|".join(map(_path_pattern, TARGET_TYPES.values())) + ")")


@dataclass(frozen=True)
class Verdict:
    """The authorizer's answer: the IAM policy for API Gateway, and what was decided about which target.
    `refusal`: "unauthenticated" (jwt mode, no JWT the identity provider vouches for: allowed through to the route,
    which verifies the caller again and answers 401 with its detail and challenge, where a raise here would count as
    the function's error and alarm), or "unavailable" (the provider's keys cannot be had: a 503)."""

    policy: dict[str, Any]
    allowed: bool
    target: Target | None
    keys_unavailable: bool = False  # denied because no token could be verified, not for what the caller sent
    refusal: str | None = None


def purchase_path(target: Target) -> str:
    """The path of `target`'s purchase route, e.g. `/limited-drops/42/orders`."""
    return TARGET_TYPES[target.type].purchase_path_of(target.id)


def route_target(target_type: str, id_text: object) -> Target | None:
    """The target a purchase route's path names, or None if the id is not a valid target id."""
    if target_type not in TARGET_TYPES or not isinstance(id_text, str):
        return None
    try:
        return Target(target_type, parse_positive_id(id_text, "target id"))
    except InvalidArgument:
        return None


def target_from_method_arn(method_arn: object) -> Target | None:
    """The target of the purchase route a method ARN names; None for anything else."""
    match = _ROUTE_ARN.fullmatch(method_arn) if isinstance(method_arn, str) else None
    if match is None or match.lastindex is None:
        return None
    return route_target(_ROUTE_TYPES[match.lastindex - 1], match[match.lastindex])


# Whether the queue applies to a user (None: not known) of a target: the feature flag.
QueueEnabled = Callable[[Target, "str | None"], bool]


def check_entry(
    signer: TokenSigner,
    target: Target,
    token_header: object,
    user_id: str,
    now: float,
) -> EntryToken | None:
    """The entry token if it is genuine, unexpired, and grants `target` to the verified user `user_id`.

    Never raises: missing, junk, oversized or non-ASCII input is simply None.
    """
    token = signer.read_entry_token(token_header, now)
    return token if token is not None and token.grants(target, user_id) else None


def request_headers(headers: object) -> dict[str, str]:
    """The headers the gate reads from an authorizer event's `headers`, by lower-case name, names matched
    case-insensitively. A header is left out when differently-cased copies disagree (the gateway and the app
    could read different ones)."""
    found: dict[str, str | None] = {}
    if isinstance(headers, dict):
        for key, value in headers.items():
            name = key.lower() if isinstance(key, str) else None
            if name in _ENTRY_HEADERS:
                agrees = isinstance(value, str) and found.get(name, value) == value
                found[name] = value if agrees else None
    return {name: value for name, value in found.items() if value is not None}


def authorize(
    signer: TokenSigner, identity: Identity, event: object, now: float, queue_enabled: QueueEnabled
) -> Verdict:
    """Judge a REQUEST authorizer event: Allow exactly this method ARN for a valid entry token of the caller, or
    for any caller while the queue is switched off for them; else Deny (or a refusal: see Verdict)."""
    if not isinstance(event, dict):
        return _deny(None, None)
    method_arn = event.get("methodArn")
    target = target_from_method_arn(method_arn)
    if not isinstance(method_arn, str) or target is None:
        return _deny(method_arn, None)
    headers = request_headers(event.get("headers"))
    try:
        user_id = identity.caller(headers).user_id
    except InvalidArgument:
        # A malformed X-User-Id: without a well-formed user id the flag cannot tell either (a percentage rollout
        # goes by user), and the route needs one anyway.
        return _deny(method_arn, target)
    except Unauthenticated:
        unverified = _policy("anonymous", "Allow", method_arn, {"identity": "unverified"})
        return Verdict(unverified, True, target, refusal="unauthenticated")
    except QueueUnavailable:
        return Verdict(_policy("anonymous", "Deny", method_arn, {}), False, target, refusal="unavailable")
    try:
        token = check_entry(signer, target, headers.get("x-entry-token"), user_id, now)
    except SigningKeysUnavailable:
        # Fail safe: no token passes unverified (and no 500), though the switched-off queue still lets through.
        token, keys_unavailable = None, True
    else:
        keys_unavailable = False
    if token is None:
        if queue_enabled(target, user_id):
            return replace(_deny(method_arn, target), keys_unavailable=keys_unavailable)
        context = {"userId": user_id, "targetType": target.type, "targetId": str(target.id), "tokenId": ""}
        return Verdict(_policy(user_id, "Allow", method_arn, context), True, target)
    context = {
        "userId": token.user_id,
        "targetType": target.type,
        "targetId": str(target.id),
        "tokenId": token.token_id,
    }
    return Verdict(_policy(token.user_id, "Allow", method_arn, context), True, target)


def context_agrees(context: Mapping[str, Any], token: EntryToken) -> bool:
    """Whether an authorizer's context describes exactly `token` (same user, target and token id)."""
    return (
        context.get("tokenId") == token.token_id
        and context.get("userId") == token.user_id
        and context.get("targetType") == token.target.type
        and context.get("targetId") == str(token.target.id)
    )


def _deny(method_arn: object, target: Target | None) -> Verdict:
    # A Deny for a malformed ARN still needs a resource; "*" is denied everything, which is what we mean.
    resource = method_arn if isinstance(method_arn, str) else "*"
    return Verdict(_policy("anonymous", "Deny", resource, {}), False, target)


def _policy(principal: str, effect: str, resource: str, context: dict[str, str]) -> dict[str, Any]:
    return {
        "principalId": principal,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": effect, "Resource": resource}],
        },
        "context": context,
    }

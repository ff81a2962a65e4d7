"""The only code that knows the format of entry tokens and queue tickets.

Both are `base64url(payload) "." base64url(HMAC-SHA256(secret[kid], payload))`, unpadded, where the
payload is ASCII fields joined by `|`, led by a kind tag (`et2` entry token, `qt2` queue ticket) so
one can never pass for the other. An entry token minted while Redis could not be asked has a tag of its own, `er2`
(a ticket holder's turn, reckoned) or `ed2` (a newcomer let in directly), so that a purchase with it is checked
against the target's state once Redis answers again. The user id, which may hold any printable character (`|` too), is
itself base64url-encoded, so the fields stay unambiguous for every id. Exactly one spelling verifies:
anything that does not re-encode to the same text is refused. Reading never raises; it answers None for
anything not genuine.

The first release's `et1`/`qt1`, whose user was a decimal id written as it is, are still read, so tickets
and tokens handed out before an upgrade keep working; nothing mints them any more.

An entry token's id (the shop's `Idempotency-Key`) is drawn from the entry it admits, not at random: the first 22
hex digits of SHA-1(entry key "|" entry number), where the entry key is an HMAC-SHA256 under the active signing
key, labelled apart from every signature, of the target and the user. Every token for one entry (a reload, an
admission made again after a failover, a direct admission in an outage) carries the same id, and nobody without
the key can tell whose id it is or guess another. enter.lua draws the id from the entry key too, as only the
script knows the seq it admits; the key itself never reaches Redis.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import math
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from re import Match, Pattern

from chalicelib.config import ConfigError, Keyring
from chalicelib.errors import SigningKeysUnavailable
from chalicelib.eta import Estimate
from chalicelib.observability import count, logger
from chalicelib.refresh import BackgroundRefresh
from chalicelib.targets import TARGET_TYPES, Target, valid_user_id

# A token is at most about 420 characters (a 128-character user id); refuse anything longer before any work on it.
MAX_TOKEN_CHARS = 512
_ID = r"[1-9][0-9]{0,17}"
_TYPES = "|".join(map(re.escape, TARGET_TYPES))
_TARGET = r"(?P<kid>[A-Za-z0-9_-]{1,32})\|(?P<type>" + _TYPES + r")\|(?P<target>" + _ID + r")"
# The user field: base64url of the user id (1 to 128 characters: 2 to 171 encoded); the first release's, the id.
_USER = r"\|(?P<user>[A-Za-z0-9_-]{2,171})"
_USER_V1 = r"\|(?P<user>" + _ID + r")"
_ENTRY_TAIL = r"\|(?P<exp>[1-9][0-9]{0,11})\|(?P<tid>[A-Za-z0-9_-]{22})"
_TICKET_TAIL = r"\|(?P<seq>" + _ID + r")\|(?P<at>[1-9][0-9]{0,15})"
# A qt2 ticket may end with the estimate its entry was first told (eta_s, low_s, high_s): the ETA's accuracy is
# measured against it at admission (chalicelib/eta.py).
_SECONDS = r"(?:0|[1-9][0-9]{0,8})"
_TOLD = r"(?:\|(?P<eta>" + _SECONDS + r")\|(?P<low>" + _SECONDS + r")\|(?P<high>" + _SECONDS + r"))?"
# Payload formats by kind tag; the tag is the payload's first field.
_ENTRY_PAYLOADS = {
    b"et2": re.compile(r"et2\|" + _TARGET + _USER + _ENTRY_TAIL),
    b"er2": re.compile(r"er2\|" + _TARGET + _USER + _ENTRY_TAIL),
    b"ed2": re.compile(r"ed2\|" + _TARGET + _USER + _ENTRY_TAIL),
    b"et1": re.compile(r"et1\|" + _TARGET + _USER_V1 + _ENTRY_TAIL),
}
_TICKET_PAYLOADS = {
    b"qt2": re.compile(r"qt2\|" + _TARGET + _USER + _TICKET_TAIL + _TOLD),
    b"qt1": re.compile(r"qt1\|" + _TARGET + _USER_V1 + _TICKET_TAIL),
}
_FIRST_RELEASE = frozenset({b"et1", b"qt1"})
# How an entry token was minted, by its kind tag: from queue state, or in an outage (see `Minted`).
_MINTED_BY_KIND = {"et2": "queue", "et1": "queue", "er2": "turn", "ed2": "direct"}
# Labels the entry keys' HMACs apart from the signatures (whose payloads start with a kind tag such as `et2|`).
_ENTRY_KEY_LABEL = b"entry-key|"
# The length of a token id: 22 characters, as the random ids of earlier releases (88 bits: no two entries of a
# target share one in any number of sales).
TOKEN_ID_CHARS = 22
_GRANT = re.compile(r"(?P<exp>[1-9][0-9]{0,11})\.(?P<tid>[A-Za-z0-9_-]{22})")


class Minted:
    """How an entry token was minted (its kind tag tells)."""

    QUEUE = "queue"  # from queue state: admitted by the pump, or the queue switched off for the user
    TURN = "turn"  # without Redis: a ticket holder's turn by dead reckoning (chalicelib/reckoning.py)
    DIRECT = "direct"  # without Redis: a newcomer let in by VQ_FAIL_MODE=open


_KIND_OF_MINTED = {Minted.QUEUE: "et2", Minted.TURN: "er2", Minted.DIRECT: "ed2"}


@dataclass(frozen=True)
class EntryToken:
    """Proof that `user_id` was admitted to `target`, usable until `expires_at` (epoch seconds)."""

    text: str
    target: Target
    user_id: str
    expires_at: int
    token_id: str
    minted: str = Minted.QUEUE

    def grants(self, target: Target, user_id: str) -> bool:
        return self.target == target and self.user_id == user_id


@dataclass(frozen=True)
class EntryGrant:
    """What queue state keeps of an entry token: its expiry and id. The signer seals the token from it, so a
    poll passes the script a grant (no signature) and a token is signed only when the answer hands one out."""

    expires_at: int
    token_id: str

    @property
    def text(self) -> str:
        return f"{self.expires_at}.{self.token_id}"

    @classmethod
    def parse(cls, text: object) -> EntryGrant | None:
        """The grant `text` spells (as queue state holds it), else None."""
        match = _GRANT.fullmatch(text) if isinstance(text, str) else None
        return cls(int(match["exp"]), match["tid"]) if match else None


@dataclass(frozen=True)
class GrantTerms:
    """An entry token's grant before its entry is known: its expiry, and the key its id is drawn with from the
    entry's number (`token_id_of`). Passed to enter.lua, which alone knows the seq it admits."""

    expires_at: int
    entry_key: str


@dataclass(frozen=True)
class QueueTicket:
    """Proof that `user_id` entered `target`'s line with sequence number `seq` at `entered_at_ms`, and was `told`
    this estimate of their wait then (None: no estimate, as in the pre-queue or while paused)."""

    text: str
    target: Target
    user_id: str
    seq: int
    entered_at_ms: int
    told: Estimate | None = None


# base64url by binascii's base64 and a translation: the base64 module wraps the same two steps in two more calls.
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def _encode(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).translate(_TO_URLSAFE).rstrip(b"=").decode("ascii")


def _decode(text: str) -> bytes | None:
    """The bytes `text` spells, only if `text` is their one canonical unpadded base64url spelling."""
    try:
        raw = binascii.a2b_base64(text.encode("ascii").translate(_FROM_URLSAFE) + b"=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    # The decoder skips stray characters and ignores trailing bits: re-encoding to `text` rules out both.
    return raw if raw and _encode(raw) == text else None


def _user_field(user_id: str) -> str:
    """The payload's spelling of a user id: its base64url, free of the `|` that separates fields."""
    return _encode(user_id.encode("ascii"))


def _user_of(field: str) -> str | None:
    """The user id a payload's user field spells canonically, else None."""
    raw = _decode(field)
    user_id = raw.decode("ascii", "replace") if raw is not None else None
    return user_id if valid_user_id(user_id) else None


def token_id_of(entry_key: str, entry: int | str) -> str:
    """The token id of the entry numbered `entry` (in decimal, as Redis spells a seq) of the entry key's user and
    target. enter.lua computes the same."""
    return hashlib.sha1(f"{entry_key}|{entry}".encode("ascii")).hexdigest()[:TOKEN_ID_CHARS]


class TokenSigner:
    """Mints and reads entry tokens and queue tickets with the keys of a keyring.

    With `refresh`, the keyring is fetched again every `max_age_s` (key rotation through Secrets Manager), in
    the background: a call never waits for it and uses the keys in hand, as after a failed refresh. Without a
    keyring at hand (`keyring` None: a cold start), the first call fetches it; if that fails, the call and every
    other until `retry_after_s` has passed raise SigningKeysUnavailable (503), and the next one after tries again.
    """

    def __init__(
        self,
        keyring: Keyring | None,
        refresh: Callable[[], Keyring] | None = None,
        max_age_s: float = 300,
        clock: Callable[[], float] = time.monotonic,
        retry_after_s: float = 1,
    ) -> None:
        if keyring is None and refresh is None:
            raise ValueError("a signer without a keyring needs a way to fetch one (refresh)")
        self._keyring = keyring
        self._refresh = refresh
        self._max_age_s = max_age_s
        self._clock = clock
        self._fresh_until = clock() + max_age_s
        self._retry_after_s = retry_after_s
        self._retry_at = float("-inf")
        self._macs_keyring: Keyring | None = None
        self._macs: dict[str, hmac.HMAC] = {}
        self.refreshing = BackgroundRefresh(self._fetch_keyring, "signing-keys-refresh")

    @property
    def keyring(self) -> Keyring:
        keyring = self._keyring
        if keyring is None:
            return self._first_keyring()
        if self._refresh is not None and self._clock() >= self._fresh_until:
            self._fresh_until = self._clock() + self._max_age_s
            self.refreshing.start()
        return keyring

    def ready(self) -> None:
        """Raise SigningKeysUnavailable unless the keys are at hand (fetching them on a cold start): a caller
        checks before it changes anything that it will have to answer with a ticket or a token."""
        self.keyring  # noqa: B018 (the property fetches)

    def _first_keyring(self) -> Keyring:
        # On the request's time: nothing can be answered without the keys. Never raised at start-up, so a
        # container that cannot reach Secrets Manager answers 503 and heals, rather than failing every start.
        if self._clock() < self._retry_at:
            raise SigningKeysUnavailable(math.ceil(self._retry_after_s))
        assert self._refresh is not None
        try:
            keyring = self._refresh()
        except ConfigError as err:
            self._retry_at = self._clock() + self._retry_after_s
            logger.error("signing keys unavailable; answering 503 until they are read", extra={"reason": str(err)})
            count("SigningKeysUnavailable")
            raise SigningKeysUnavailable(math.ceil(self._retry_after_s)) from None
        self._fresh_until = self._clock() + self._max_age_s
        self._keyring = keyring
        return keyring

    def _fetch_keyring(self) -> None:
        assert self._refresh is not None
        try:
            self._keyring = self._refresh()
        except ConfigError as err:
            logger.error("signing keys not refreshed; keeping the current ones", extra={"reason": str(err)})

    def mint_entry_token(
        self,
        target: Target,
        user_id: str,
        now: float,
        ttl_s: int,
        entry: int | None = None,
        minted: str = Minted.QUEUE,
    ) -> EntryToken:
        """A token for `user_id`'s entry numbered `entry` (their ticket's number) of `target`; with no entry (the
        queue switched off, a newcomer in an outage), under a random id."""
        if entry is None:
            grant = EntryGrant(int(now) + ttl_s, secrets.token_hex(TOKEN_ID_CHARS // 2 + 1)[:TOKEN_ID_CHARS])
        else:
            grant = self.grant(target, user_id, entry, now, ttl_s)
        return self.seal_entry_token(target, user_id, grant, minted)

    def grant(self, target: Target, user_id: str, entry: int, now: float, ttl_s: int) -> EntryGrant:
        """The token id of `user_id`'s entry numbered `entry`, with an expiry: the entry token to seal if and when
        it is handed out."""
        return EntryGrant(int(now) + ttl_s, token_id_of(self.entry_key(target, user_id), entry))

    def grant_terms(self, target: Target, user_id: str, now: float, ttl_s: int) -> GrantTerms:
        """What enter.lua needs to draw the grant of whichever entry it admits."""
        return GrantTerms(int(now) + ttl_s, self.entry_key(target, user_id))

    def entry_key(self, target: Target, user_id: str) -> str:
        """The key (64 hex digits) the token ids of `user_id`'s entries of `target` are drawn with."""
        keyring = self.keyring
        subject = f"{target.type}|{target.id}|{_user_field(user_id)}".encode("ascii")
        return hmac.new(keyring.secrets[keyring.active_kid], _ENTRY_KEY_LABEL + subject, hashlib.sha256).hexdigest()

    def seal_entry_token(
        self, target: Target, user_id: str, grant: EntryGrant, minted: str = Minted.QUEUE
    ) -> EntryToken:
        """The entry token of `grant` for `user_id` of `target`, signed with the active key."""
        kind = _KIND_OF_MINTED[minted]
        text = self._seal(kind, target.type, target.id, _user_field(user_id), grant.expires_at, grant.token_id)
        return EntryToken(text, target, user_id, grant.expires_at, grant.token_id, minted)

    def read_entry_token(self, text: object, now: float) -> EntryToken | None:
        """The genuine, unexpired entry token `text` spells, else None."""
        opened = self._open(text, _ENTRY_PAYLOADS)
        if opened is None or int(opened[0]["exp"]) <= now:
            return None
        fields, user_id = opened
        return EntryToken(
            str(text),
            Target(fields["type"], int(fields["target"])),
            user_id,
            int(fields["exp"]),
            fields["tid"],
            _MINTED_BY_KIND[fields.string[:3]],
        )

    def issue_ticket(
        self, target: Target, user_id: str, seq: int, entered_at_ms: int, told: Estimate | None = None
    ) -> QueueTicket:
        fields: tuple[object, ...] = (target.type, target.id, _user_field(user_id), seq, entered_at_ms)
        if told is not None:
            fields += (told.eta_s, told.low_s, told.high_s)
        return QueueTicket(self._seal("qt2", *fields), target, user_id, seq, entered_at_ms, told)

    def read_ticket(self, text: object) -> QueueTicket | None:
        """The genuine queue ticket `text` spells, else None."""
        opened = self._open(text, _TICKET_PAYLOADS)
        if opened is None:
            return None
        fields, user_id = opened
        told = fields.groupdict().get("eta")
        return QueueTicket(
            str(text),
            Target(fields["type"], int(fields["target"])),
            user_id,
            int(fields["seq"]),
            int(fields["at"]),
            None if told is None else Estimate(int(told), int(fields["low"]), int(fields["high"])),
        )

    def _seal(self, kind: str, *fields: object) -> str:
        keyring = self.keyring
        raw = "|".join(map(str, (kind, keyring.active_kid, *fields))).encode("ascii")
        mac = self._mac(keyring, keyring.active_kid)
        mac.update(raw)
        return _encode(raw) + "." + _encode(mac.digest())

    def _open(self, text: object, formats: Mapping[bytes, Pattern[str]]) -> tuple[Match[str], str] | None:
        """The payload's fields and its user id, if `text` is genuine and of one of `formats`."""
        if not isinstance(text, str) or len(text) > MAX_TOKEN_CHARS or not text.isascii():
            return None
        payload_text, _, signature_text = text.partition(".")
        payload = _decode(payload_text)
        if payload is None:
            return None
        payload_format = formats.get(payload[:3])
        match = payload_format.fullmatch(payload.decode("ascii", "replace")) if payload_format else None
        if match is None:
            return None
        user_id = match["user"] if payload[:3] in _FIRST_RELEASE else _user_of(match["user"])
        if user_id is None:
            return None
        keyring = self.keyring
        if match["kid"] not in keyring.secrets:
            return None
        mac = self._mac(keyring, match["kid"])
        mac.update(payload)
        # Only the canonical spelling of the right signature equals it (a second "." included), so one
        # constant-time comparison of the texts checks the encoding and the signature together.
        return (match, user_id) if hmac.compare_digest(_encode(mac.digest()), signature_text) else None

    def _mac(self, keyring: Keyring, kid: str) -> hmac.HMAC:
        """A fresh HMAC-SHA256 under key `kid` of `keyring`."""
        if keyring is not self._macs_keyring:
            # Keyed once per keyring and copied per token: keying costs about as much as the MAC itself.
            self._macs = {kid: hmac.new(secret, digestmod=hashlib.sha256) for kid, secret in keyring.secrets.items()}
            self._macs_keyring = keyring
        return self._macs[kid].copy()

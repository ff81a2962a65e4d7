"""Entry tokens and queue tickets: one genuine spelling each, and nothing else verifies."""

import base64
import hashlib
import hmac

import pytest

from chalicelib.config import Keyring
from chalicelib.targets import Target
from chalicelib.tokens import EntryGrant, TokenSigner

SECRET_A = "a" * 40
SECRET_B = "b" * 40
DROP = Target("limited-drop", 42)
NOW = 1_800_000_000.0


def signer(active="k1", **secrets):
    secrets = secrets or {"k1": SECRET_A}
    return TokenSigner(Keyring({k: v.encode() for k, v in secrets.items()}, active))


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@pytest.fixture
def token():
    return signer().mint_entry_token(DROP, "7", NOW, ttl_s=300)


def test_minted_token_reads_back_with_its_claims(token):
    read = signer().read_entry_token(token.text, NOW + 299)
    assert read == token
    assert read.grants(DROP, "7")
    assert not read.grants(Target("limited-drop", 43), "7")
    assert not read.grants(Target("ticketing-event", 42), "7")
    assert not read.grants(DROP, "8")


def test_a_held_grant_seals_the_same_token_again(token):
    grant = EntryGrant.parse(EntryGrant(token.expires_at, token.token_id).text)
    assert signer().seal_entry_token(DROP, "7", grant) == token
    assert EntryGrant.parse(token.text) is None and EntryGrant.parse(None) is None
    assert EntryGrant.parse(f"0{grant.text}") is None and EntryGrant.parse(f"{grant.text}\n") is None


def test_token_ids_without_an_entry_are_unique(token):
    ids = {signer().mint_entry_token(DROP, "7", NOW, 300).token_id for _ in range(1000)}
    assert len(ids) == 1000


def test_one_entry_has_one_token_id_whenever_and_however_long_it_is_minted():
    first = signer().mint_entry_token(DROP, "7", NOW, 300, entry=12)
    again = signer().mint_entry_token(DROP, "7", NOW + 90, 60, entry=12)
    assert first.token_id == again.token_id and first.text != again.text
    assert signer().grant(DROP, "7", 12, NOW, 300).token_id == first.token_id
    assert len(first.token_id) == 22 and int(first.token_id, 16) >= 0


def test_token_ids_of_other_entries_users_targets_or_keys_differ():
    ids = {
        signer().mint_entry_token(DROP, "7", NOW, 300, entry=12).token_id,
        signer().mint_entry_token(DROP, "7", NOW, 300, entry=13).token_id,
        signer().mint_entry_token(DROP, "8", NOW, 300, entry=12).token_id,
        signer().mint_entry_token(Target("limited-drop", 43), "7", NOW, 300, entry=12).token_id,
        signer().mint_entry_token(Target("ticketing-event", 42), "7", NOW, 300, entry=12).token_id,
        signer(k1="c" * 40).mint_entry_token(DROP, "7", NOW, 300, entry=12).token_id,
        # After a rotation the new active key draws the ids: an entry admitted again across it gets a new one.
        signer(active="k2", k1=SECRET_A, k2=SECRET_B).mint_entry_token(DROP, "7", NOW, 300, entry=12).token_id,
    }
    assert len(ids) == 7


def test_a_token_id_is_drawn_under_the_key_apart_from_any_signature():
    token = signer().mint_entry_token(DROP, "7", NOW, 300, entry=12)
    # Without the key the id is no digest of the entry's own fields, and the entry key is no signature's MAC.
    entry_key = signer().entry_key(DROP, "7")
    assert token.token_id == hashlib.sha1(f"{entry_key}|12".encode()).hexdigest()[:22]
    unkeyed = hashlib.sha256(f"limited-drop|42|{b64(b'7')}".encode()).hexdigest()
    labelled_alike = hmac.new(SECRET_A.encode(), f"limited-drop|42|{b64(b'7')}".encode(), "sha256").hexdigest()
    assert entry_key not in (unkeyed, labelled_alike)


def test_expired_token_is_refused(token):
    assert signer().read_entry_token(token.text, NOW + 300) is None


def test_every_flipped_bit_is_refused(token):
    raw = token.text.encode()
    for index in range(len(raw)):
        for bit in range(7):  # stay within ASCII; the 8th bit is covered by the non-ASCII test
            mutated = bytearray(raw)
            mutated[index] ^= 1 << bit
            text = mutated.decode("ascii")
            if text != token.text:
                assert signer().read_entry_token(text, NOW) is None, (index, bit)


def resigned(token_text: str, edit) -> str:
    """The token with its payload edited and signed again with a key the verifier does not know."""
    payload = unb64(token_text.split(".")[0]).decode()
    forged = edit(payload).encode()
    return b64(forged) + "." + b64(hmac.new(b"not-the-key" * 4, forged, hashlib.sha256).digest())


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p.replace("|42|", "|43|"),
        lambda p: p.replace("limited-drop", "ticketing-event"),
        lambda p: p.replace("|Nw|", "|OA|"),  # the user field: base64url of "7", then of "8"
        lambda p: p.replace(str(int(NOW) + 300), str(int(NOW) + 99999)),
    ],
)
def test_claims_changed_and_signed_with_another_key_are_refused(token, edit):
    assert signer().read_entry_token(resigned(token.text, edit), NOW) is None


def test_payload_swapped_onto_a_genuine_signature_is_refused(token):
    other = signer().mint_entry_token(Target("limited-drop", 43), "7", NOW, 300)
    spliced = other.text.split(".")[0] + "." + token.text.split(".")[1]
    assert signer().read_entry_token(spliced, NOW) is None


def test_unknown_key_id_is_refused(token):
    assert signer(k2=SECRET_A, active="k2").read_entry_token(token.text, NOW) is None


def test_token_of_a_non_active_listed_key_verifies(token):
    rotated = signer(active="k2", k1=SECRET_A, k2=SECRET_B)
    assert rotated.read_entry_token(token.text, NOW) == token
    assert rotated.mint_entry_token(DROP, "7", NOW, 300).text != token.text


@pytest.mark.parametrize(
    "spell",
    [
        lambda t: t + "=",
        lambda t: t.replace(".", "=."),
        lambda t: " " + t,
        lambda t: t + "\n",
        lambda t: t.replace(".", ".."),
        lambda t: t + ".",
        lambda t: "." + t,
        lambda t: t + ".x",
        lambda t: t.replace("-", "+").replace("_", "/") if ("-" in t or "_" in t) else t + "+",
        lambda t: t[:-1] + "é",
        lambda t: t[:10] + "\u0000" + t[10:],
        lambda t: t.split(".")[0],
    ],
)
def test_non_canonical_spellings_are_refused(token, spell):
    assert signer().read_entry_token(spell(token.text), NOW) is None


def test_unused_trailing_bits_make_a_second_spelling_that_is_refused(token):
    payload, signature = token.text.split(".")
    # 32 signature bytes take 43 characters; the last one carries 2 unused bits.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(signature[-1])
    for spare in (1, 2, 3):
        other = signature[:-1] + alphabet[last ^ spare]
        assert unb64(other) == unb64(signature)  # the same bytes...
        assert signer().read_entry_token(f"{payload}.{other}", NOW) is None  # ...but not the one spelling


@pytest.mark.parametrize(
    "junk",
    ["", ".", "..", "x", "a.b", "€.€", "x" * 10_000, "A" * 10_000 + "." + "B" * 43, None, 42, b"bytes.bytes", ["list"]],
)
def test_junk_is_refused_without_an_exception(junk):
    assert signer().read_entry_token(junk, NOW) is None
    assert signer().read_ticket(junk) is None


def test_ticket_round_trip_and_separation_from_tokens(token):
    ticket = signer().issue_ticket(DROP, "7", seq=12, entered_at_ms=1_800_000_000_123)
    assert signer().read_ticket(ticket.text) == ticket
    # A ticket is never an entry token, nor the other way round.
    assert signer().read_entry_token(ticket.text, NOW) is None
    assert signer().read_ticket(token.text) is None


def signed(payload: str) -> str:
    """`payload` signed with the verifier's own key k1: what only a holder of the key can make."""
    raw = payload.encode()
    return b64(raw) + "." + b64(hmac.new(SECRET_A.encode(), raw, hashlib.sha256).digest())


@pytest.mark.parametrize("user", ["a|b", "|", "7|limited-drop|43", "{limited-drop:9}", "auth0|x.y", "~" * 128, "42"])
def test_any_user_id_round_trips_and_cannot_shift_the_fields(user):
    token = signer().mint_entry_token(DROP, str(user), NOW, 300)
    read = signer().read_entry_token(token.text, NOW)
    assert read == token and read.user_id == user and read.target == DROP
    ticket = signer().issue_ticket(DROP, str(user), seq=3, entered_at_ms=1_800_000_000_000)
    assert signer().read_ticket(ticket.text) == ticket


@pytest.mark.parametrize(
    "user_field",
    [
        "Nx",  # "7" with trailing bits set: a second spelling of the same id
        "Nw==",  # padded
        "IA",  # " ": not a user id
        b64(b"a" * 129),  # too long
    ],
)
def test_a_user_field_that_is_not_one_canonical_user_id_is_refused_even_signed(user_field):
    exp = int(NOW) + 300
    assert signer().read_entry_token(signed(f"et2|k1|limited-drop|42|{user_field}|{exp}|{'A' * 22}"), NOW) is None
    assert signer().read_ticket(signed(f"qt2|k1|limited-drop|42|{user_field}|5|1800000000000")) is None


def test_the_first_release_s_tokens_and_tickets_are_still_read():
    exp = int(NOW) + 300
    token = signer().read_entry_token(signed(f"et1|k1|limited-drop|42|7|{exp}|{'A' * 22}"), NOW)
    assert token is not None and token.user_id == "7" and token.grants(DROP, "7")
    ticket = signer().read_ticket(signed("qt1|k1|limited-drop|42|7|5|1800000000000"))
    assert ticket is not None and (ticket.user_id, ticket.seq) == ("7", 5)
    # Their user field was a decimal id, nothing else.
    assert signer().read_entry_token(signed(f"et1|k1|limited-drop|42|a|{exp}|{'A' * 22}"), NOW) is None

"""Python and the Lua scripts agree by name: every script's header, its bindings and its replies match the
contract chalicelib/scripts.py declares, and the store calls and reads scripts by those names alone."""

import dataclasses
import re

import pytest

from chalicelib import shop_health
from chalicelib.scripts import CONTRACTS, FOLLOW_ARGS, LUA_DIR, OUTBOX_ARGS, Contract, Script

KEY_LINE = re.compile(r"^-- KEYS\[(\d+)\] (\w+)\s", re.M)
ARG_LINE = re.compile(r"^-- ARGV\[(\d+)\] (\w+)\s", re.M)
REST_LINE = re.compile(r"^-- ARGV\[(\d+)\.\.\] (\w+)\s", re.M)
REPLY_LINE = re.compile(r"^-- Returns \{([^}]*)\}", re.M)
TAGGED_LINE = re.compile(r"^--\s+\{'([A-Z_]+)'(?:, ([^}]*))?\}", re.M)
BINDING = r"^local ([\w\s,]+?)\s*=\s*unpack\({}\)"
TAGGED_RETURN = re.compile(r"return \{'([A-Z_]+)'(.*)\}\s*$", re.M)


def header(text: str) -> str:
    """The comment lines a script opens with."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines) + "\n"


def names(listed: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in listed.split(",") if name.strip())


def numbered(matches: list[tuple[str, str]], first: int = 1) -> tuple[list[str], tuple[str, ...]]:
    """The names of `-- KEYS[i] name` lines, and a problem if the lines do not count 1, 2, 3... in order."""
    problems = [f"line {index} is not number {i}" for i, (index, _) in enumerate(matches, first) if int(index) != i]
    return problems, tuple(name for _, name in matches)


def top_level_items(text: str) -> int:
    """How many comma-separated items `, a, f(b, c), 'd,e'` holds (the text after a reply's tag)."""
    depth, quote, items = 0, None, 0
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items += 1
    return items


def contract_problems(text: str, contract: Contract) -> list[str]:
    """Every way a script's text disagrees with its contract (empty: they agree)."""
    head = header(text)
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return header_problems(head, contract) + binding_problems(body, contract) + reply_problems(head, body, contract)


def header_problems(head: str, contract: Contract) -> list[str]:
    """The header's KEYS and ARGV lines against the contract's names and order."""
    problems = []
    for source, pattern, declared in (("KEYS", KEY_LINE, contract.keys), ("ARGV", ARG_LINE, contract.args)):
        order, listed = numbered(pattern.findall(head))
        problems += [f"{source} {p}" for p in order]
        if listed != declared:
            problems.append(f"header {source} {listed} != contract {declared}")
    rest = REST_LINE.findall(head)
    if [name for _, name in rest] != ([contract.rest] if contract.rest else []):
        problems.append(f"header's trailing ARGV list {rest} != contract {contract.rest}")
    elif rest and int(rest[0][0]) != len(contract.args) + 1:
        problems.append(f"the trailing list starts at ARGV[{rest[0][0]}], not right after the named ARGV")
    return problems


def binding_problems(body: str, contract: Contract) -> list[str]:
    """The body binds every key and argument to its name once, and indexes neither by number."""
    problems = []
    for source, declared in (("KEYS", contract.keys), ("ARGV", contract.args)):
        bound = [names(b) for b in re.findall(BINDING.format(source), body, re.M)]
        if declared and bound != [declared]:
            problems.append(f"{source} bound as {bound}, not once as {declared}")
    if re.search(r"KEYS\[", body):
        problems.append("the body indexes KEYS instead of using the bound names")
    if re.search(r"ARGV\[\s*\d+\s*\]", body):
        problems.append("the body indexes ARGV by number instead of using the bound names")
    if contract.rest is None and re.search(r"ARGV\[", body):
        problems.append("the body reads ARGV past the named arguments, but the contract has no trailing list")
    if contract.reporting and not re.search(r"outbox\(events, stats, outbox_cap, outbox_ttl_ms\)", body):
        problems.append("a reporting script writes its events with outbox(events, stats, outbox_cap, outbox_ttl_ms)")
    return problems


def reply_problems(head: str, body: str, contract: Contract) -> list[str]:
    """The header's Returns lines against the contract's reply, and each tagged return of the body."""
    problems = []
    fixed = [names(r) for r in REPLY_LINE.findall(head)]
    if fixed != ([contract.reply] if contract.reply else []):
        problems.append(f"header's reply {fixed} != contract {contract.reply}")
    tagged = {tag: names(fields or "") for tag, fields in TAGGED_LINE.findall(head)}
    if tagged != dict(contract.replies):
        problems.append(f"header's tagged replies {tagged} != contract {dict(contract.replies)}")
    for tag, fields in TAGGED_RETURN.findall(body):
        if tag not in contract.replies:
            problems.append(f"the body returns {tag!r}, which the contract does not declare")
        elif top_level_items(fields) != len(contract.replies[tag]):
            problems.append(f"the body returns {tag!r} with {top_level_items(fields)} fields")
    return problems


def lua(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text()


def test_every_script_has_a_contract_and_every_contract_a_script():
    scripts = {path.stem for path in LUA_DIR.glob("*.lua")} - {"outbox", "budget"}
    assert scripts == set(CONTRACTS)


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_the_script_s_header_bindings_and_replies_match_its_contract(name):
    assert contract_problems(lua(name), CONTRACTS[name]) == []


def swap_lines(text: str, first: str, second: str) -> str:
    a, b = text.index(first), text.index(second)
    line_a, line_b = text[a : text.index("\n", a)], text[b : text.index("\n", b)]
    return text.replace(line_a, "\0").replace(line_b, line_a).replace("\0", line_b)


def test_a_header_a_binding_or_a_contract_changed_alone_is_caught():
    text, contract = lua("status"), CONTRACTS["status"]
    # Two keys swapped in the header only (descriptions and all).
    assert contract_problems(swap_lines(text, "-- KEYS[1] ", "-- KEYS[2] "), contract)
    # Two arguments swapped in the binding only.
    swapped = text.replace("local user_id, now_ms,", "local now_ms, user_id,", 1)
    assert swapped != text and contract_problems(swapped, contract)
    # The contract's order changed alone.
    assert contract_problems(text, dataclasses.replace(contract, keys=contract.keys[::-1]))
    # A reply field added to the script's answer but not to the contract.
    grown = text.replace("return {'OFF'}", "return {'OFF', 1}", 1)
    assert grown != text and contract_problems(grown, contract)
    # An index back in the body.
    assert contract_problems(text + "\nredis.call('GET', KEYS[1])\n", contract)


def test_the_shop_following_rules_are_the_rate_script_s_arguments_by_name():
    rules = [f.name for f in dataclasses.fields(shop_health.FollowRules)]
    assert sorted(rules) == sorted(FOLLOW_ARGS)
    assert set(FOLLOW_ARGS) <= set(CONTRACTS["adjust_rate"].args)


def test_a_reordered_rules_class_sends_the_same_arguments():
    """Arguments go by name: the field order of FollowRules is not the script's."""
    fields = [(f.name, f.type, f) for f in dataclasses.fields(shop_health.FollowRules)][::-1]
    reordered = dataclasses.make_dataclass("Reordered", fields, frozen=True)()
    script = Script(None, "adjust_rate", "", CONTRACTS["adjust_rate"])
    common = {
        "config": "c",
        "health": "h",
        "purchases": "p",
        "default_tick_ms": 1,
        "default_batch": 2,
        "health_ttl_ms": 3,
    }
    original = script.bind(**common, **dataclasses.asdict(shop_health.FollowRules()))
    assert script.bind(**common, **dataclasses.asdict(reordered)) == original
    assert original.args[3:] == tuple(getattr(shop_health.FollowRules(), name) for name in FOLLOW_ARGS)


def test_a_call_names_every_key_and_argument_and_nothing_else():
    script = Script(None, "forget_target", "", CONTRACTS["forget_target"])
    assert script.bind(registry="r", target="limited-drop:1", nonce=7) == (script, ("r",), ("limited-drop:1", 7))
    with pytest.raises(TypeError, match="nonce"):
        script.bind(registry="r", target="limited-drop:1")
    with pytest.raises(TypeError, match="seed"):
        script.bind(registry="r", target="limited-drop:1", nonce=7, seed=1)
    with pytest.raises(TypeError, match="list"):
        script.bind([1, 2], registry="r", target="limited-drop:1", nonce=7)


def test_a_reply_is_read_by_name_and_a_reply_of_another_shape_is_refused():
    admit = Script(None, "admit", "", CONTRACTS["admit"])
    tick = admit.read(list(range(15)))
    assert (tick.applied_tick, tick.mark, tick.per_tick) == (0, 2, 12)
    with pytest.raises(ValueError):
        admit.read(list(range(14)))
    status = Script(None, "status", "", CONTRACTS["status"])
    assert status.read(["WAITING", 5, 2, "50", 0, "3", "100", "2000", "0", [None] * 4]).ahead == 2
    with pytest.raises(ValueError):
        status.read(["WAITING", 5, 2, "50", 0])
    with pytest.raises(ValueError):
        status.read(["QUEUED", 5])


def test_reporting_scripts_take_the_outbox_arguments():
    for name, contract in CONTRACTS.items():
        assert contract.reporting == (set(OUTBOX_ARGS) <= set(contract.args)), name

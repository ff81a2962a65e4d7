"""Python and the Lua scripts agree by name: every script's header, its bindings and its replies match the
contract chalicelib/scripts.py declares, and the store calls and reads scripts by those names alone. And the
scripts keep to the data model (chalicelib/data_model.py): every key and hash field they write or read is declared,
with them among its writers or readers, and every field declared is used as declared."""

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from chalicelib import data_model, shop_health
from chalicelib.scripts import CONTRACTS, FOLLOW_ARGS, LUA_DIR, OUTBOX_ARGS, Contract, Script
from chalicelib.target_config import TargetConfig

KEY_LINE = re.compile(r"^-- KEYS\[(\d+)\] (\w+)\s", re.M)
ARG_LINE = re.compile(r"^-- ARGV\[(\d+)\] (\w+)\s", re.M)
REST_LINE = re.compile(r"^-- ARGV\[(\d+)\.\.\] (\w+)\s", re.M)
REPLY_LINE = re.compile(r"^-- Returns \{([^}]*)\}", re.M)
TAGGED_LINE = re.compile(r"^--\s+\{'([A-Z_]+)'(?:, ([^}]*))?\}", re.M)
BINDING = r"^local ([\w\s,]+?)\s*=\s*unpack\({}\)"
CHALICELIB = Path(data_model.__file__).parent
# The preludes scripts.py puts before scripts (not scripts of their own), and the keys their parameters name.
PRELUDES = {"budget": {"key": "budget"}, "outbox": {"stats": "stats", "stream": "events"}}


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


def skip_string(text: str, i: int) -> int:
    """The index after the Lua string literal that starts at `i`."""
    quote, i = text[i], i + 1
    while text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def code_of(text: str) -> str:
    """A script's code: its text without comments (strings kept)."""
    out, i = [], 0
    while i < len(text):
        if text[i] in "'\"":
            end = skip_string(text, i)
            out.append(text[i:end])
            i = end
        elif text.startswith("--", i):
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def bracketed(code: str, start: int) -> str:
    """What the bracket at `start` encloses, across lines."""
    depth, i = 0, start
    while True:
        if code[i] in "'\"":
            i = skip_string(code, i)
            continue
        depth += code[i] in "([{"
        depth -= code[i] in ")]}"
        if depth == 0:
            return code[start + 1 : i]
        i += 1


def items(inner: str) -> list[str]:
    """The top-level comma-separated items of `a, f(b, c), 'd,e'`."""
    found, depth, start, i = [], 0, 0, 0
    while i < len(inner):
        if inner[i] in "'\"":
            i = skip_string(inner, i)
            continue
        depth += inner[i] in "([{"
        depth -= inner[i] in ")]}"
        if inner[i] == "," and depth == 0:
            found.append(inner[start:i].strip())
            start = i + 1
        i += 1
    rest = inner[start:].strip()
    return [*found, rest] if rest else found


def literal(expression: str) -> str | None:
    match = re.fullmatch(r"'([^'\\]*)'|\"([^\"\\]*)\"", expression)
    return None if match is None else match[1] if match[1] is not None else match[2]


def contract_problems(text: str, contract: Contract) -> list[str]:
    """Every way a script's text disagrees with its contract (empty: they agree)."""
    head = header(text)
    body = code_of(text)
    return header_problems(head, contract) + binding_problems(body, contract) + reply_problems(head, body, contract)


def header_problems(head: str, contract: Contract) -> list[str]:
    """The header's KEYS and ARGV lines against the contract's names and order."""
    problems = []
    for source, pattern, declared in (("KEYS", KEY_LINE, contract.all_keys), ("ARGV", ARG_LINE, contract.all_args)):
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
    for source, declared in (("KEYS", contract.all_keys), ("ARGV", contract.all_args)):
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


def returned_tables(body: str) -> list[list[str]]:
    """The items of every table a `return {...}` of the body answers, however many lines it spans."""
    return [items(bracketed(body, match.end() - 1)) for match in re.finditer(r"\breturn\s*\{", body)]


def reply_problems(head: str, body: str, contract: Contract) -> list[str]:
    """The header's Returns lines against the contract's reply, and every table the body returns against it."""
    problems = []
    # A fixed reply's header line may run on over the next comment lines.
    fixed = [names(re.sub(r"\n--\s*", " ", r)) for r in REPLY_LINE.findall(head)]
    if fixed != ([contract.reply] if contract.reply else []):
        problems.append(f"header's reply {fixed} != contract {contract.reply}")
    tagged = {tag: names(fields or "") for tag, fields in TAGGED_LINE.findall(head)}
    if tagged != dict(contract.replies):
        problems.append(f"header's tagged replies {tagged} != contract {dict(contract.replies)}")
    for answer in returned_tables(body):
        if any(item.startswith("unpack(") for item in answer):
            problems.append(f"a reply's length is not visible: {answer}")
        elif contract.replies:
            tag = literal(answer[0]) if answer else None
            if tag not in contract.replies:
                problems.append(f"the body returns {answer[:1]}, a tag the contract does not declare")
            elif len(answer) - 1 != len(contract.replies[tag]):
                problems.append(f"the body returns {tag!r} with {len(answer) - 1} fields")
        elif contract.reply and not (contract.may_be_empty and not answer) and len(answer) != len(contract.reply):
            problems.append(f"the body returns {len(answer)} fields, not {len(contract.reply)}")
        elif not contract.reply:
            problems.append(f"the body returns a table, but the contract declares a single value: {answer}")
    return problems


# --- the data model: the keys and hash fields every script writes and reads ---

WRITES = {
    "SET",
    "ZADD",
    "ZREM",
    "ZREMRANGEBYSCORE",
    "HSET",
    "HSETNX",
    "HINCRBY",
    "HDEL",
    "DEL",
    "XADD",
    "LPUSH",
    "RPOP",
    "LTRIM",
    "RENAME",
}
READS = {
    "GET",
    "ZSCORE",
    "ZMSCORE",
    "ZCOUNT",
    "ZCARD",
    "ZRANGE",
    "ZRANGEBYSCORE",
    "HGET",
    "HMGET",
    "HGETALL",
    "LRANGE",
    "LINDEX",
    "XLEN",
    "HSETNX",
}
TTL_ONLY = {"PEXPIRE", "PEXPIREAT", "PTTL"}
# A hash command's field arguments: the first only, every one, or every other (HSET's field, value pairs).
FIELDS_AT = {"HGET": "first", "HSETNX": "first", "HINCRBY": "first", "HMGET": "all", "HDEL": "all", "HSET": "pairs"}
SETTINGS = "<settings>"  # configure.lua's trailing list: the operator's settings, field, value, ...


@dataclass(frozen=True)
class Access:
    """One key (and hash field: `*` for HGETALL) a script writes or reads, as its code spells it."""

    key: str
    field: str | None
    write: bool


def accesses(text: str, keys: dict[str, str]) -> tuple[set[Access], list[str]]:
    """What a script's `redis.call`s write and read, `keys` naming the key each variable holds; and the calls it
    cannot place (a command this test does not know, a variable that names no key)."""
    found, problems = set(), []
    body = code_of(text)
    for match in re.finditer(r"redis\.call\(", body):
        command, *args = items(bracketed(body, match.end() - 1))
        command = (literal(command) or command).upper()
        if command == "TIME" or command in TTL_ONLY:
            continue
        if command not in WRITES | READS:
            problems.append(f"redis.call('{command}') is neither a known write nor a known read")
            continue
        key = keys.get(args[0])
        if key is None:
            problems.append(f"redis.call('{command}', {args[0]}, ...): `{args[0]}` names no key")
            continue
        if command == "RENAME":  # the source key becomes the destination: a write of both
            found.add(Access(keys.get(args[1], args[1]), None, True))
        writes = command in WRITES
        reads = command in READS or (command == "SET" and "'GET'" in args)
        found |= {Access(key, None, write) for write, done in ((True, writes), (False, reads)) if done}
        found |= {Access(key, field, writes) for field in hash_fields(command, args[1:])}
    return found, problems


def hash_fields(command: str, args: list[str]) -> list[str]:
    """The fields a hash command names: literals, `eta_error:<>` for a literal prefix and a variable, `<>` for a
    variable alone, `*` for all (HGETALL), SETTINGS for configure.lua's trailing list."""
    if command == "HGETALL":
        return ["*"]
    at = FIELDS_AT.get(command)
    chosen = args[:1] if at == "first" else args if at == "all" else args[0::2] if at == "pairs" else []
    fields = []
    for expression in chosen:
        if expression.startswith("unpack(ARGV"):
            fields.append(SETTINGS)
            break
        name = literal(expression)
        prefix = re.match(r"'([^']*)'\s*\.\.", expression)
        fields.append(name if name is not None else f"{prefix[1]}<>" if prefix else "<>")
    return fields


def lua_files() -> dict[str, str]:
    """Every file of lua/, by its name in the data model (`enter.lua`)."""
    return {path.name: path.read_text() for path in sorted(LUA_DIR.glob("*.lua"))}


def key_names(name: str, text: str) -> dict[str, str]:
    """What each variable of a script names: its KEYS by the contract's names, a prelude's parameters."""
    stem = name.removesuffix(".lua")
    if stem in PRELUDES:
        return PRELUDES[stem]
    return {key: key for key in CONTRACTS[stem].all_keys}


def model_problems(files: dict[str, str], model: dict[str, data_model.Key]) -> list[str]:
    """Every way `files` (lua/ by name) and the data model `model` disagree (empty: they agree)."""
    problems: list[str] = []
    used: dict[str, set[Access]] = {}
    for name, text in files.items():
        found, unplaced = accesses(text, key_names(name, text))
        problems += [f"{name}: {p}" for p in unplaced]
        used[name] = found
        for key_name in {a.key for a in found}:
            key = model.get(key_name)
            if key is None:
                problems.append(f"{name} uses `{key_name}`, a key the data model does not declare")
                continue
            for write, side, declared in ((True, "writes", key.writers), (False, "reads", key.readers)):
                if any(a.key == key_name and a.write == write for a in found) and name not in declared:
                    problems.append(f"{name} {side} `{key_name}`, but the model does not list it")
        for access in found:
            key = model.get(access.key)
            if key is None or access.field in (None, "*", SETTINGS):
                continue
            declared = declared_field(key, access.field)
            if declared is None:
                problems.append(
                    f"{name} names field `{access.field}` of `{access.key}`, which the model does not declare"
                )
            elif name not in (declared.writers if access.write else declared.readers):
                side = "writes" if access.write else "reads"
                problems.append(f"{name} {side} `{access.key}.{access.field}`, but the model does not list it")
    for key in model.values():
        for name in files:
            for write, side, declared in ((True, "writes", key.writers), (False, "reads", key.readers)):
                if name in declared and not any(a.key == key.name and a.write == write for a in used[name]):
                    problems.append(f"the model says {name} {side} `{key.name}`, but it does not")
        for field in key.fields:
            problems += field_problems(key, field, files, used)
    return problems


def declared_field(key: data_model.Key, spelt: str) -> data_model.Field | None:
    """The field of `key` a script's `spelt` names (a family's member: `eta_error:<>`), else None."""
    if spelt == SETTINGS:
        return None
    for field in key.fields:
        head = field.name.partition("<")[0]
        if field.name == spelt or ("<" in field.name and spelt == head + "<>"):
            return field
    return None


def field_problems(key, field, files, used) -> list[str]:
    """A declared field against its declared writers and readers: each uses it so, and some script or module does."""
    problems = []
    setting = field in data_model.SETTINGS
    if not field.writers and not field.readers:
        problems.append(f"`{key.name}.{field.name}` has neither writer nor reader")
    for write, side, declared in ((True, "writes", field.writers), (False, "reads", field.readers)):
        for name in declared:
            if name in files:
                spelt = {a.field for a in used[name] if a.key == key.name and a.write == write}
                matched = any(declared_field(key, s) is field for s in spelt if s)
                if not (matched or (not write and "*" in spelt) or (write and setting and SETTINGS in spelt)):
                    problems.append(f"the model says {name} {side} `{key.name}.{field.name}`, but it does not")
            elif name.endswith(".py") and not (setting and name == "target_config.py"):
                source = (CHALICELIB / name).read_text()
                head = field.name.partition("<")[0]
                if f'"{head}' not in source and f"'{head}" not in source:
                    problems.append(
                        f"the model says {name} {side} `{key.name}.{field.name}`, but it names no such field"
                    )
            elif not name.endswith(".py"):
                problems.append(f"`{key.name}.{field.name}`: {name} is neither a file of lua/ nor of chalicelib/")
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


def test_a_reply_that_spans_lines_is_counted_whole():
    text, contract = lua("status"), CONTRACTS["status"]
    # WAITING's answer runs over two lines: a field added on its second line is still one too many.
    grown = text.replace("  tick_ms or default_tick_ms, drawn,", "  tick_ms or default_tick_ms, drawn, 0,", 1)
    assert grown != text
    assert contract_problems(grown, contract) == ["the body returns 'WAITING' with 12 fields"]
    # admit.lua's one answer, over four lines, against a contract a field shorter.
    admit = CONTRACTS["admit"]
    shorter = dataclasses.replace(admit, reply=admit.reply[:-1])
    assert "the body returns 16 fields, not 15" in contract_problems(lua("admit"), shorter)
    # An answer whose length only runs time could tell.
    assert contract_problems(lua("admit").replace("fenced_to, spans}", "unpack(fenced)}", 1), admit)


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
    assert script.bind(targets="r", target="limited-drop:1", nonce=7) == (script, ("r",), ("limited-drop:1", 7))
    with pytest.raises(TypeError, match="nonce"):
        script.bind(targets="r", target="limited-drop:1")
    with pytest.raises(TypeError, match="seed"):
        script.bind(targets="r", target="limited-drop:1", nonce=7, seed=1)
    with pytest.raises(TypeError, match="list"):
        script.bind([1, 2], targets="r", target="limited-drop:1", nonce=7)


def test_the_admitting_keys_and_arguments_go_all_together_after_the_others_or_not_at_all():
    contract = CONTRACTS["status"]
    script = Script(None, "status", "", contract)
    common = {name: name for name in (*contract.keys, *contract.args)}
    admitting = {name: name for name in (*contract.admitting_keys, *contract.admitting_args)}
    assert script.order(**common) == (contract.keys, contract.args)
    assert script.order(**common, **admitting) == (contract.all_keys, contract.all_args)
    with pytest.raises(TypeError, match="all of"):
        script.order(**common, grant="g")


def test_a_reply_is_read_by_name_and_a_reply_of_another_shape_is_refused():
    admit = Script(None, "admit", "", CONTRACTS["admit"])
    tick = admit.read(list(range(16)))
    assert (tick.applied_tick, tick.mark, tick.per_tick) == (0, 2, 12)
    with pytest.raises(ValueError):
        admit.read(list(range(15)))
    status = Script(None, "status", "", CONTRACTS["status"])
    assert status.read(["WAITING", 5, 2, "50", 0, "3", "100", "2000", "0", None, None, "7"]).ahead == 2
    assert status.read(["DUE"]).tag == "DUE"
    with pytest.raises(ValueError):
        status.read(["WAITING", 5, 2, "50", 0])
    with pytest.raises(ValueError):
        status.read(["QUEUED", 5])


def test_reporting_scripts_take_the_outbox_arguments():
    for name, contract in CONTRACTS.items():
        assert contract.reporting == (set(OUTBOX_ARGS) <= set(contract.args)), name


def test_every_key_and_hash_field_the_scripts_write_and_read_is_declared_with_them_in_the_data_model():
    assert model_problems(lua_files(), data_model.KEYS) == []


def test_a_field_the_model_does_not_declare_is_caught():
    files = lua_files()
    files["status.lua"] = files["status.lua"].replace("'sold_out_released'", "'sold_out_let_go'")
    assert model_problems(files, data_model.KEYS) == [
        "status.lua names field `sold_out_let_go` of `stats`, which the model does not declare",
        "the model says status.lua writes `stats.sold_out_released`, but it does not",
    ]


def test_a_declared_field_no_script_uses_is_caught():
    stats = data_model.KEYS["stats"]
    unused = data_model.Field("fence_owed", "places owed", ("admit.lua",), ("status.lua",))
    model = {**data_model.KEYS, "stats": dataclasses.replace(stats, fields=(*stats.fields, unused))}
    assert model_problems(lua_files(), model) == [
        "the model says admit.lua writes `stats.fence_owed`, but it does not",
        "the model says status.lua reads `stats.fence_owed`, but it does not",
    ]
    silent = data_model.Field("spare", "nothing", (), ())
    model = {**data_model.KEYS, "stats": dataclasses.replace(stats, fields=(*stats.fields, silent))}
    assert model_problems(lua_files(), model) == ["`stats.spare` has neither writer nor reader"]


def test_a_key_written_or_read_where_the_model_does_not_say_is_caught():
    files = lua_files()
    files["leave.lua"] += "\nredis.call('GET', fence)\n"  # leave.lua has no such key
    files["evict.lua"] += "\nredis.call('HINCRBY', stats, 'left', 1)\n"
    assert model_problems(files, data_model.KEYS) == [
        "evict.lua writes `stats.left`, but the model does not list it",
        "leave.lua: redis.call('GET', fence, ...): `fence` names no key",
    ]
    # A Python module said to read a field it never names.
    draw = data_model.KEYS["draw"]
    fields = tuple(
        dataclasses.replace(f, readers=(*f.readers, "pump.py")) if f.name == "seed" else f for f in draw.fields
    )
    model = {**data_model.KEYS, "draw": dataclasses.replace(draw, fields=fields)}
    assert model_problems(lua_files(), model) == [
        "the model says pump.py reads `draw.seed`, but it names no such field"
    ]


def test_the_operator_s_settings_are_the_target_configuration_s_fields():
    assert [field.name for field in data_model.SETTINGS] == [f.name for f in dataclasses.fields(TargetConfig)]


def test_the_keys_the_pump_slides_are_the_ones_the_model_says():
    code = code_of(lua("admit"))
    function = code[code.index("local function keep_alive()") :]
    listed = names(bracketed(function, function.index("ipairs({") + len("ipairs(")))
    assert set(listed) == {key.name for key in data_model.TARGET_KEYS if key.slid}

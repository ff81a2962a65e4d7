"""The data model (chalicelib/data_model.py) is the one list of the queue's keys: the key names the code builds, the
keys the scripts are passed, and the state tables of docs/architecture.md all follow it. (What the scripts do with
each key and field: tests/test_script_contracts.py.)"""

from collections import Counter
from pathlib import Path

from chalicelib import data_model
from chalicelib.queue_keys import GlobalKeys, QueueKeys, shard_of
from chalicelib.scripts import CONTRACTS
from chalicelib.targets import Target

ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
BEGIN, END = "<!-- the data model: .venv/bin/python -m chalicelib.data_model -->", "<!-- end of the data model -->"


def test_the_key_names_the_code_builds_are_the_model_s_keys():
    keys = QueueKeys("vq", Target("limited-drop", 42))
    built = {name: value for name, value in vars(keys).items() if name != "base"}
    per_member = {key.name for key in data_model.TARGET_KEYS if key.per}
    assert set(built) == {key.name for key in data_model.TARGET_KEYS} - per_member
    assert all(value == f"vq:{{limited-drop:42}}:{name}" for name, value in built.items())
    assert {keys.token("7"), keys.consumed("t1")} == {
        "vq:{limited-drop:42}:token:7",
        "vq:{limited-drop:42}:consumed:t1",
    }
    assert per_member == {"token", "consumed"}
    # A sub-line past the first is the same set of keys under a hash tag of its own (docs/sharding.md).
    # Its tag depends on the count of sub-lines (chalicelib/queue_keys.py `sub_line_tag`); sub-line 0's never does.
    third = QueueKeys("vq", Target("limited-drop", 42), 2, 3)
    assert third.waiting == "vq:{limited-drop:42#2.17}:waiting"
    assert QueueKeys("vq", Target("limited-drop", 42), 0, 3).waiting == keys.waiting
    outside = GlobalKeys("vq")
    assert {getattr(outside, key.name.replace("-", "_")) for key in data_model.GLOBAL_KEYS} == {
        f"vq:{key.name}" for key in data_model.GLOBAL_KEYS
    }


def test_a_target_s_config_is_told_from_a_user_key_that_ends_like_one():
    outside = GlobalKeys("vq")
    assert outside.is_config("vq:{limited-drop:42}:config")
    assert not outside.is_config("vq:{limited-drop:42}:token:x:config")


def test_every_key_a_script_is_passed_is_in_the_model():
    passed = {key for contract in CONTRACTS.values() for key in contract.all_keys}
    assert passed <= set(data_model.KEYS), passed - set(data_model.KEYS)


def test_the_architecture_page_s_state_tables_are_the_model_s():
    text = ARCHITECTURE.read_text()
    shown = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip("\n") + "\n"
    assert shown == data_model.tables(), "regenerate them: .venv/bin/python -m chalicelib.data_model"


def test_users_spread_evenly_over_the_sub_lines_and_always_to_the_same_one():
    users = [f"user-{n}" for n in range(30_000)]
    assert {shard_of(user, 1) for user in users} == {0}
    counts = Counter(shard_of(user, 3) for user in users)
    assert set(counts) == {0, 1, 2}
    # Each sub-line within 3 % of a third: about ten standard deviations of a fair split.
    assert all(abs(n - 10_000) < 300 for n in counts.values())
    # Pinned: a user's sub-line must not change between releases (a process-seeded hash would move everyone).
    assert [shard_of(user, 3) for user in users[:8]] == [2, 2, 1, 0, 0, 0, 0, 0]
    assert shard_of("auth0|abc123", 64) == 58

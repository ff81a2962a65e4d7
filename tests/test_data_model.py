"""The data model (chalicelib/data_model.py) is the one list of the queue's keys: the key names the code builds, the
keys the scripts are passed, and the state tables of docs/architecture.md all follow it. (What the scripts do with
each key and field: tests/test_script_contracts.py.)"""

from pathlib import Path

from chalicelib import data_model
from chalicelib.queue_keys import GlobalKeys, QueueKeys
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

"""docs/configuration.md is the reference of every setting: it names exactly the variables chalicelib/config.py
reads, with the defaults the code applies."""

import re
from pathlib import Path

from chalicelib.targets import TARGET_TYPES

ROOT = Path(__file__).resolve().parent.parent
SOURCE = (ROOT / "chalicelib" / "config.py").read_text()
DOC = (ROOT / "docs" / "configuration.md").read_text()


def documented() -> dict[str, str]:
    """Each variable of the page's table, with its default column."""
    rows = {}
    for line in DOC.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            for name in re.findall(r"`([A-Z_]+)`", cells[0]):
                rows[name] = cells[1].strip("`")
    return rows


def test_the_page_documents_every_variable_the_code_reads_and_no_other():
    read = set(re.findall(r'"((?:VQ|REDIS)_[A-Z_]+)"', SOURCE))
    origins = {kind.origin_variable for kind in TARGET_TYPES.values()}  # config.py reads one per target type
    assert read | origins == set(documented())


def test_the_documented_numeric_defaults_are_the_code_s():
    # `_positive_int(env, "VQ_TICK_MS", 2000, ...)` and `_bounded_int(env, "VQ_FLAG_POLL_S", 15, ...)`
    in_code = {
        name: int(default.replace("_", "")) for name, default in re.findall(r'"(VQ_[A-Z_]+)", ([0-9_]+)', SOURCE)
    }
    assert in_code, "the pattern no longer finds the defaults in chalicelib/config.py"
    assert {name: documented()[name] for name in in_code} == {name: str(value) for name, value in in_code.items()}


def test_the_documented_choice_defaults_are_the_code_s():
    # `_choice(env, "VQ_FAIL_MODE", {...}, "open")`
    in_code = dict(re.findall(r'_choice\(env, "(VQ_[A-Z_]+)", \{[^}]*\}, "([a-z]+)"\)', SOURCE))
    assert in_code
    assert {name: documented()[name] for name in in_code} == in_code

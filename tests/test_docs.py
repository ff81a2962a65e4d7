"""The README and docs/ stay true to the repository: the README is a front door of at most 250 lines that starts
with the two commands; every link leads to a file of the repository, never outside it; every test a page names
exists; every make target the README lists exists."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
TEST_REFERENCE = re.compile(r"tests/((?:[\w/]+/)?test_\w+\.py)::(test_\w+)")


def test_the_readme_is_a_front_door_that_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    first_block = lines[lines.index("```sh") + 1 : lines.index("```")]
    assert [line.split()[:2] for line in first_block] == [["make", "run"], ["make", "test"]]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_leads_to_a_file_of_the_repository(page):
    text = page.read_text()
    for target in LINK.findall(text):
        assert not re.match(r"[a-z]+:", target), f"{page.name} links outside the repository: {target}"
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{page.name}: {target} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{page.name}: {target} names no heading of {resolved.name}"
    assert "../shared" not in text


def anchors(page: Path) -> set[str]:
    """The anchors a markdown renderer gives the page's headings (GitHub's rule: lower case, no punctuation)."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def defined_tests() -> set[tuple[str, str]]:
    """Every test function of the suite, as (path under tests/, name), read from the sources."""
    tests = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                tests.add((path.relative_to(ROOT / "tests").as_posix(), node.name))
    return tests


def test_every_test_a_page_names_exists():
    named = {(path, name) for page in PAGES for path, name in TEST_REFERENCE.findall(page.read_text())}
    assert named, "the pages name no test: the guarantees page names its proofs as tests/<file>.py::<test>"
    missing = named - defined_tests()
    assert not missing, f"the docs name tests that do not exist: {sorted(missing)}"


def test_every_make_target_the_readme_names_exists():
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"`make ([a-z][\w-]*)", README.read_text()))
    assert named <= targets, named - targets

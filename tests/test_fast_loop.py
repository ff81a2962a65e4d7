"""`make test-fast` builds no deployment: every test that needs it is marked `deploy` (tests/conftest.py), and the
fast loop leaves that marker out."""

import re
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import pytest_collection_modifyitems

MAKEFILE = Path(__file__).resolve().parent.parent / "Makefile"


def test_a_test_that_needs_the_deployment_is_marked_deploy_and_the_fast_loop_leaves_it_out():
    marked = []

    def test_using(*fixtures):
        return SimpleNamespace(fixturenames=fixtures, add_marker=lambda mark: marked.append((fixtures, mark.name)))

    pytest_collection_modifyitems([test_using("resources", "template", "deployment"), test_using("room", "client")])
    assert marked == [(("resources", "template", "deployment"), "deploy")]
    fast = re.search(r'^test-fast:.*\n\t.* -m "([^"]+)"', MAKEFILE.read_text(), re.M)[1]
    assert "not deploy" in fast and "not slow" in fast

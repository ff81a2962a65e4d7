"""docs/operations.md cannot rot: every `vq` command in its shell blocks runs, in the page's order, against the
local stack and must succeed; every `aws` command must name a real service, operation and parameters (with a
valid value where the parameter takes one of a list) in the AWS CLI's own models (botocore's), with every
required parameter; and every stack output (`out NAME`) and resource (`res NAME`) it reads must be in the
built template."""

import re
import shlex
import time
from pathlib import Path

import botocore.session
import pytest
from botocore import xform_name

from infra.vq import cli

pytestmark = pytest.mark.slow  # the local stack in its own processes, and the deployment built

RUNBOOK = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
# Options every aws command takes (the CLI's own, not the operation's).
GLOBAL_OPTIONS = {"query", "output", "region", "profile", "no-cli-pager", "debug", "endpoint-url", "no-paginate"}
# Parameters the AWS CLI names otherwise than the API does (its customizations): (service, operation, the CLI's
# name) -> the model's.
CLI_RENAMES = {("sns", "subscribe", "notification-endpoint"): "endpoint"}
# Commands of the AWS CLI itself, not of a service: (command, subcommand) -> how many arguments it takes.
CLI_OWN = {("configure", "set"): 2}
# vq commands that run until Ctrl-C or open a browser: the test makes them end by themselves.
FINITE = {"watch": ["--count", "1", "--interval", "0.1"], "console": ["--no-browser"]}


def shell_lines() -> list[str]:
    """Every command line of the page's ```sh blocks, in order (continuation lines joined)."""
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", RUNBOOK.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def outermost(line: str) -> list[tuple[int, int]]:
    """(start, end) of every outermost `$(...)` in `line`: line[start:end] is the whole `$(...)`."""
    spans, i = [], 0
    while (start := line.find("$(", i)) != -1:
        depth, j = 0, start + 1
        for j in range(start + 1, len(line)):
            depth += {"(": 1, ")": -1}.get(line[j], 0)
            if depth == 0:
                break
        spans.append((start, j + 1))
        i = j + 1
    return spans


def substitutions(line: str) -> list[str]:
    """The text inside every `$(...)` in `line`, nested ones too."""
    found = []
    for start, end in outermost(line):
        inner = line[start + 2 : end - 1]
        found += [inner, *substitutions(inner)]
    return found


def flattened(line: str) -> str:
    """`line` with each outermost `$(...)` as one placeholder word."""
    for start, end in reversed(outermost(line)):
        line = line[:start] + "SUBSTITUTED" + line[end:]
    return line


def aws_commands() -> list[str]:
    commands = []
    for line in shell_lines():
        if line.startswith("out()") or line.startswith("res()"):
            commands += [s for s in substitutions(line) if s.startswith("aws ")]
            commands.append(re.search(r"\{ (aws .*?); \}", line)[1])
            continue
        commands += [s for s in substitutions(line) if s.startswith("aws ")]
        bare = flattened(line).split("=", 1)[-1] if re.match(r"[A-Z_]+=", line) else flattened(line)
        if bare.startswith("aws "):
            commands.append(bare)
    return commands


def test_the_runbook_has_vq_and_aws_commands_for_every_phase():
    text = RUNBOOK.read_text()
    for heading in ("The day before", "Ten minutes before", "During the sale", "After the sale", "Incidents"):
        assert f"## {heading}" in text
    vq_lines = [line for line in shell_lines() if line.startswith("vq ")]
    assert {shlex.split(line)[1] for line in vq_lines} >= {
        "open", "show", "stats", "watch", "console", "pause", "resume", "set", "sold-out", "close", "targets",
    }  # fmt: skip
    assert len(aws_commands()) >= 15


def test_every_vq_command_of_the_runbook_runs_against_the_local_stack(stack, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("VQ_API_URL", stack.url)
    monkeypatch.chdir(tmp_path)  # where `> file` lands
    ran = []
    for line in shell_lines():
        if line.startswith("export VQ_API_URL="):
            continue  # the test's own VQ_API_URL stands in for the stack's output
        if not line.startswith("vq "):
            continue
        words = shlex.split(line)
        redirect = words.index(">") if ">" in words else None
        args = words[1:redirect] if redirect else words[1:]
        args += FINITE.get(args[0], [])
        if "--at" in args and args[0] == "open":
            # The page's sale day lies ahead: run it as a sale that opened a minute ago, so that closing it now
            # comes after its opening.
            args[args.index("--at") + 1] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
        status = cli.main(args)
        out, err = capsys.readouterr()
        assert status == 0, f"`{line}` exited {status}: {err}"
        if redirect:
            (tmp_path / words[redirect + 1]).write_text(out)
        ran.append(args[0])
    assert "open" in ran and ran.index("open") < ran.index("pause")
    assert (tmp_path / "sale-limited-drop-42-stats.json").read_text().startswith("{")


@pytest.mark.parametrize("command", aws_commands())
def test_every_aws_command_of_the_runbook_exists_with_its_parameters(command):
    words = shlex.split(command)
    assert words[0] == "aws"
    service, operation = words[1], words[2]
    if (service, operation) in CLI_OWN:
        assert len(words) == 3 + CLI_OWN[service, operation], command
        return
    session = botocore.session.get_session()
    assert service in session.get_available_services(), f"no AWS service {service!r}: {command}"
    model = session.get_service_model(service)
    operations = {xform_name(name, "-"): name for name in model.operation_names}
    assert operation in operations, f"aws {service} has no {operation!r}"
    op = model.operation_model(operations[operation])
    inputs = op.input_shape.members.items() if op.input_shape else []
    members = {xform_name(name, "-"): (name, shape) for name, shape in inputs}
    given, positional, i = set(), [], 3
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            positional.append(word)
            i += 1
            continue
        name = word[2:]
        takes_value = i + 1 < len(words) and not words[i + 1].startswith("--")
        values = []
        if takes_value:
            j = i + 1
            while j < len(words) and not words[j].startswith("--"):
                values.append(words[j])
                j += 1
            i = j
        else:
            i += 1
        if name in GLOBAL_OPTIONS:
            continue
        name = CLI_RENAMES.get((service, operation, name), name)
        assert name in members, f"aws {service} {operation} takes no --{name}"
        given.add(members[name][0])
        check_enum(command, name, members[name][1], values)
    required = set(op.input_shape.required_members) if op.input_shape else set()
    assert required <= given, f"`{command}` lacks {sorted(required - given)}"
    # An operation that answers a stream (a file's content) takes the file to write it to.
    assert len(positional) <= (1 if op.has_streaming_output else 0), f"unexpected arguments {positional}: {command}"


def check_enum(command, name, shape, values):
    """A value of a parameter that takes one of a list (or a list of such) is one of them."""
    if shape.type_name == "list":
        shape = shape.member
    if shape.type_name == "string" and shape.enum:
        for value in values:
            if value != "SUBSTITUTED":
                assert value in shape.enum, f"--{name} {value} is none of {shape.enum}: {command}"


def test_every_output_and_resource_the_runbook_reads_is_in_the_template(template):
    text = RUNBOOK.read_text()
    outputs = set(re.findall(r"\$\(out (\w+)\)", text)) | set(re.findall(r"`(\w+)` output", text))
    resources = set(re.findall(r"\$\(res (\w+)\)", text))
    alarms = set(re.findall(r"`(\w+Alarm)`", text))
    listed = re.findall(r"stack parameters? ((?:`\w+`(?:,\s*)?)+)", text)
    parameters = {name for names in listed for name in re.findall(r"`(\w+)`", names)}
    assert "EnterLimitPerIp" in parameters and parameters <= set(template["Parameters"]), parameters
    assert outputs and resources and alarms
    assert outputs <= set(template["Outputs"]), outputs - set(template["Outputs"])
    assert resources <= set(template["Resources"]), resources - set(template["Resources"])
    # An alarm's name, or the parameter of its threshold.
    assert alarms <= set(template["Resources"]) | set(template["Parameters"]), alarms - set(template["Resources"])

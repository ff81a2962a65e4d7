"""The parts of the public contracts that name the target types, written from chalicelib/targets.py's TARGET_TYPES:
in infra/openapi.yaml the purchase route of each type (over the operation they share, `x-purchase`) and every
`enum` of types (the lines marked `# the target types`); in infra/events.schema.json the target's `type` and the
event id's pattern. So adding a type is one entry there, then:

    .venv/bin/python -m infra.target_types

tests/test_target_types.py fails while either file is not as this writes it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chalicelib.targets import TARGET_TYPES, TargetType  # noqa: E402

OPENAPI = ROOT / "infra" / "openapi.yaml"
EVENTS_SCHEMA = ROOT / "infra" / "events.schema.json"
ROUTES_BEGIN = "  # The target types' purchase routes: written by `python -m infra.target_types` (do not edit).\n"
ROUTES_END = "  # End of the target types' purchase routes.\n"
ENUM = re.compile(r"^(.*enum: )\[[^\]]*\](.*  # the target types)$", re.M)


def route(kind: TargetType) -> str:
    """One type's purchase route, in infra/openapi.yaml's spelling."""
    operation = kind.operation_id or "purchase" + "".join(part.title() for part in kind.name.split("-"))
    summary = kind.summary or f"Buy ({kind.labels['en']}), forwarded once per entry token to its downstream."
    if ": " in summary or " #" in summary:  # plain YAML would read these as a mapping or a comment
        summary = json.dumps(summary)
    return (
        f"  {kind.purchase_path}:\n"
        f"    parameters:\n"
        f"      - name: {kind.id_parameter}\n"
        f"        in: path\n"
        f"        required: true\n"
        f'        schema: {{$ref: "#/components/schemas/PositiveId"}}\n'
        f"    post:\n"
        f"      <<: *purchase\n"
        f"      operationId: {operation}\n"
        f"      summary: {summary}\n"
    )


def openapi(text: str, types: Mapping[str, TargetType]) -> str:
    """`text` (infra/openapi.yaml) with its type-dependent parts written from `types`."""
    names = ", ".join(types)
    text = ENUM.sub(lambda match: f"{match[1]}[{names}]{match[2]}", text)
    start, end = text.index(ROUTES_BEGIN) + len(ROUTES_BEGIN), text.index(ROUTES_END)
    return text[:start] + "\n".join(route(kind) for kind in types.values()) + text[end:]


def events_schema(text: str, types: Mapping[str, TargetType]) -> str:
    """`text` (infra/events.schema.json) with the target's type and the event id's pattern written from `types`."""
    schema = json.loads(text)
    schema["$defs"]["target"]["properties"]["type"]["enum"] = list(types)
    # Type names are lower-case words and hyphens (TargetType): nothing to escape.
    schema["$defs"]["eventId"]["pattern"] = f"^({'|'.join(types)}):[1-9][0-9]{{0,17}}/[0-9]+-[0-9]+$"
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def write(types: Mapping[str, TargetType] = TARGET_TYPES, spec: Path = OPENAPI, schema: Path = EVENTS_SCHEMA) -> None:
    """Write the type-dependent parts of `spec` and `schema` from `types`."""
    spec.write_text(openapi(spec.read_text(), types))
    schema.write_text(events_schema(schema.read_text(), types))


if __name__ == "__main__":
    write()
    print(f"wrote {OPENAPI.relative_to(ROOT)} and {EVENTS_SCHEMA.relative_to(ROOT)} from chalicelib/targets.py")

"""Lint rules for infra/openapi.yaml beyond schema validity (openapi-spec-validator): the rules of Redocly's
`recommended` set that client generators depend on, written out here because Redocly's CLI is an npm package
and `make test` needs nothing but Python and pip.

| rule (Redocly name) | what it demands |
|---|---|
| no-empty-servers | a `servers` entry, so generated clients know the base path |
| operation-2xx-response | every operation documents a 2xx answer (`default` alone does not say what success is) |
| security-defined | every operation states its security, `[]` when it has none, and names declared schemes only |
| operation-operationId, operation-operationId-unique | a unique operationId per operation (the method names) |
| operation-summary | a summary per operation |
| operation-tag-defined | every tag an operation uses is declared at the top with a description |
| path-parameters-defined | every `{name}` in a path is a declared path parameter, and no other |
| no-unused-components | every component is referenced |
"""

from __future__ import annotations

import re

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def lint(document: dict) -> list[str]:
    """Every rule the document breaks, one line each (empty: clean)."""
    problems: list[str] = []
    if not document.get("servers") or not all(server.get("url") for server in document["servers"]):
        problems.append("no-empty-servers: no server URL")
    schemes = set(document.get("components", {}).get("securitySchemes", {}))
    tags = {tag["name"]: tag.get("description") for tag in document.get("tags", [])}
    shared = document.get("components", {}).get("parameters", {})
    seen_ids: set[str] = set()
    for path, item in document.get("paths", {}).items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            where = f"{method.upper()} {path}"
            responses = {str(status) for status in operation.get("responses", {})}
            if not any(re.fullmatch(r"2[0-9X]{2}", status) for status in responses):
                problems.append(f"operation-2xx-response: {where} has no 2xx response")
            security = operation.get("security", document.get("security"))
            if security is None:
                problems.append(f"security-defined: {where} states no security")
            for requirement in security or []:
                for name in set(requirement) - schemes:
                    problems.append(f"security-defined: {where} names undeclared scheme {name}")
            operation_id = operation.get("operationId")
            if not operation_id or operation_id in seen_ids:
                problems.append(f"operation-operationId-unique: {where} has a missing or repeated operationId")
            seen_ids.add(operation_id)
            if not operation.get("summary"):
                problems.append(f"operation-summary: {where} has no summary")
            for tag in operation.get("tags", []):
                if not tags.get(tag):
                    problems.append(f"operation-tag-defined: {where} uses undeclared or undescribed tag {tag}")
            parameters = [
                shared[p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p
                for p in item.get("parameters", []) + operation.get("parameters", [])
            ]
            declared = {p["name"] for p in parameters if p.get("in") == "path"}
            if declared != set(re.findall(r"{([^}]+)}", path)):
                problems.append(f"path-parameters-defined: {where} declares path parameters {sorted(declared)}")
    problems += [f"no-unused-components: {ref} is never referenced" for ref in _unused_components(document)]
    return problems


def _unused_components(document: dict) -> list[str]:
    referenced = set(re.findall(r"#/components/[A-Za-z]+/[A-Za-z0-9_.-]+", repr(document)))
    security_names = {
        name
        for item in document.get("paths", {}).values()
        for method in METHODS
        for requirement in (item.get(method) or {}).get("security", [])
        for name in requirement
    }
    unused = []
    for kind, components in document.get("components", {}).items():
        for name in components:
            if kind == "securitySchemes" and name in security_names:
                continue
            if f"#/components/{kind}/{name}" not in referenced:
                unused.append(f"#/components/{kind}/{name}")
    return unused

"""Build the deployment: the CloudFormation (SAM) template and the Lambda zip, into one folder.

    python infra/package.py [--stage prod] OUT_DIR

The template pieces in infra/ (one per concern, PIECES) are deep-merged into OUT_DIR/merge-template.json,
with the flag's default (infra/flags.json) as the AppConfig hosted version; `chalice package --merge-template`
deep-merges that into the template it generates and writes OUT_DIR/sam.json and OUT_DIR/deployment.zip.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

INFRA = Path(__file__).resolve().parent
PIECES = ("settings", "network", "cache", "secrets", "appconfig", "authorizer", "pump", "observability")


def deep_merge(into: dict, piece: dict, path: str = "") -> dict:
    """Merge `piece` into `into` and return it: mappings merge key by key, like Chalice's own merge.

    Any other value (text, number, list) may be set by one piece only: a second, different one is an
    error, so no piece silently undoes another.
    """
    for key, value in piece.items():
        where = f"{path}.{key}" if path else key
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            deep_merge(into[key], value, where)
        elif key in into and into[key] != value:
            raise ValueError(f"two template pieces set {where} differently")
        else:
            into[key] = copy.deepcopy(value)  # pieces reuse mappings through YAML anchors: never share one
    return into


def merge_template(pieces: tuple[str, ...] = PIECES) -> dict:
    """The pieces merged in order, with infra/flags.json as the flag's hosted configuration."""
    merged: dict = {}
    for name in pieces:
        deep_merge(merged, yaml.safe_load((INFRA / f"{name}.yaml").read_text()))
    flags = json.loads((INFRA / "flags.json").read_text())
    merged["Resources"]["FlagDefault"]["Properties"]["Content"] = json.dumps(flags)
    return merged


def package(out: Path, stage: str = "prod") -> Path:
    """Write merge-template.json, sam.json and deployment.zip into `out`; return the template's path."""
    out.mkdir(parents=True, exist_ok=True)
    merge_file = out / "merge-template.json"
    merge_file.write_text(json.dumps(merge_template(), indent=2) + "\n")
    chalice = Path(sys.executable).parent / "chalice"
    # Chalice wants a region to start; the template names none (it uses AWS::Region).
    env = {"AWS_DEFAULT_REGION": "us-east-1", **os.environ}
    subprocess.run(
        [str(chalice), "package", "--stage", stage, "--merge-template", str(merge_file), str(out)],
        cwd=INFRA.parent, env=env, check=True,
    )
    return out / "sam.json"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", default="prod", help="Chalice stage (.chalice/config.json)")
    parser.add_argument("out", type=Path, help="folder for merge-template.json, sam.json, deployment.zip")
    args = parser.parse_args()
    print(package(args.out, args.stage))

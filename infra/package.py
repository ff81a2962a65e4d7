"""Build the deployment: the CloudFormation (SAM) template and the Lambda zip, into one folder.

    python infra/package.py [--stage prod] [--architecture arm64|x86_64] OUT_DIR

The template pieces in infra/ (one per concern, PIECES) are deep-merged into OUT_DIR/merge-template.json,
with the flag's default (infra/flags.json) as the AppConfig hosted version and the cache nodes' alarms
(node_alarms); `chalice package --merge-template` deep-merges that into the template it generates and writes
OUT_DIR/sam.json and OUT_DIR/deployment.zip, with the dependencies built for the functions' architecture
(.chalice/config.json: arm64). The zip then gets the bytecode of every module in it: Lambda imports from a
read-only directory, where Python cannot write what it compiles, and would compile the whole package again on
every cold start.
"""

from __future__ import annotations

import argparse
import compileall
import copy
import json
import os
import py_compile
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

INFRA = Path(__file__).resolve().parent
PIECES = (
    "settings",
    "capacity",
    "network",
    "cache",
    "secrets",
    "appconfig",
    "authorizer",
    "edge",
    "distribution",
    "access",
    "pump",
    "events",
    "logs",
    "observability",
)
# The functions' runtime is this interpreter's: Chalice writes it into the template and downloads the C extensions
# (hiredis, orjson) built for it, and the bytecode added below is its own. Build with the Python you deploy
# (docs/deploy.md: make package PYTHON=python3.13 VENV=.venv-3.13).
RUNTIMES = ("python3.11", "python3.12", "python3.13")  # Lambda runtimes built and tested (tests/test_packaging.py)
RUNTIME = f"python{sys.version_info.major}.{sys.version_info.minor}"
# The functions' architecture: arm64 (Graviton) costs a fifth less per GB-second than x86_64, and every C
# extension of the package (hiredis, orjson, cryptography) ships manylinux aarch64 wheels, which Chalice fetches
# for it. x86_64 builds the same code for this machine's tests, which run the unpacked package here.
ARCHITECTURES = ("arm64", "x86_64")
ARCHITECTURE = json.loads((INFRA.parent / ".chalice" / "config.json").read_text())["lambda_architecture"]
# `chalice package`, with the architecture given rather than read from .chalice/config.json alone (Chalice's own
# command line takes none): its configuration chain puts parameters given by the caller first.
CHALICE_PACKAGE = """
import sys
from chalice.cli.factory import CLIFactory
stage, merge_template, out, architecture = sys.argv[1:]
factory = CLIFactory(project_dir=".")
config = factory.create_config_obj(stage, user_provided_params={"lambda_architecture": architecture})
options = factory.create_package_options()
factory.create_app_packager(config, options, "cloudformation", "json", merge_template).package_app(config, out, stage)
"""

# The cache nodes' alarms (docs/alarms.md). ElastiCache files a node's metrics under its own id,
# `<group>-<shard>-<node>`, and nothing for a node that does not exist; no alarm can search for the nodes a
# group has. So each kind below has one alarm per shard, created when CacheShards makes that shard, watching
# every node the shard can have (a primary and up to five replicas) through the highest of their values.
MAX_SHARDS = 8  # CacheShards' MaxValue (infra/cache.yaml)
NODES_PER_SHARD = 6  # a primary and CacheReplicasPerShard's MaxValue
NODE_ALARMS = {
    # name: (metric, above, for minutes, what it means and what to do)
    "CacheMemory": (
        "DatabaseMemoryUsagePercentage",
        75,
        3,
        "For 3 minutes a cache node of shard {shard} used more than 75% of its memory; at 100% it refuses every "
        "write (noeviction) and the queue answers 503. Scale the node type up now.",
    ),
    "CacheEngineCpu": (
        "EngineCPUUtilization",
        80,
        2,
        "For 2 minutes a cache node of shard {shard} had its engine thread busier than 80%; every script waits "
        "its turn on it, so latency climbs. Lower the rate or the poll load, or move to a faster node type.",
    ),
    "CacheReplicationLag": (
        "ReplicationLag",
        1,
        3,
        "For 3 minutes a replica of shard {shard} was more than 1 s behind its primary; a failover now would lose "
        "that second of writes (places restored from tickets, heartbeats, marks).",
    ),
}


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
    """The pieces merged in order, with infra/flags.json as the flag's hosted configuration and the cache nodes'
    alarms (node_alarms) on the dashboard."""
    merged: dict = {}
    for name in pieces:
        deep_merge(merged, yaml.safe_load((INFRA / f"{name}.yaml").read_text()))
    flags = json.loads((INFRA / "flags.json").read_text())
    merged["Resources"]["FlagDefault"]["Properties"]["Content"] = json.dumps(flags)
    alarms, on_the_dashboard = node_alarms()
    deep_merge(merged, alarms)
    merged["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"][1]["CacheAlarms"]["Fn::If"][1] = (
        on_the_dashboard
    )
    return merged


def shard_condition(shard: int) -> str:
    """The condition under which the cache has shard `shard` (1-based)."""
    return "CacheOnNodes" if shard == 1 else f"CacheShard{shard}"


def node_metric(metric: str, shard: int, node: int) -> dict:
    """An alarm's query of `metric` on node `node` of shard `shard` (both 1-based), as ElastiCache files it."""
    return {
        "Id": f"n{node}",
        "ReturnData": False,
        "MetricStat": {
            "Metric": {
                "Namespace": "AWS/ElastiCache",
                "MetricName": metric,
                "Dimensions": [
                    {"Name": "CacheClusterId", "Value": {"Fn::Sub": f"${{ReplicationGroup}}-{shard:04}-{node:03}"}}
                ],
            },
            "Period": 60,
            "Stat": "Maximum",
        },
    }


def node_alarms() -> tuple[dict, dict]:
    """The alarms of NODE_ALARMS for every shard the cache may have, with the conditions that create them; and
    their ARNs as the dashboard's alarm widget lists them (the shards that exist)."""
    conditions: dict = {}
    resources: dict = {}
    listed = []
    nodes = range(1, NODES_PER_SHARD + 1)
    for shard in range(1, MAX_SHARDS + 1):
        if shard > 1:
            fewer = [{"Fn::Equals": [{"Ref": "CacheShards"}, n]} for n in range(1, shard)]
            conditions[shard_condition(shard)] = {
                "Fn::And": [
                    {"Condition": "CacheOnNodes"},
                    {"Fn::Not": [fewer[0] if len(fewer) == 1 else {"Fn::Or": fewer}]},
                ]
            }
        names = []
        for kind, (metric, above, minutes, description) in NODE_ALARMS.items():
            highest = {
                "Id": "highest",
                "Label": "the highest node",
                "Expression": f"MAX([{', '.join(f'n{node}' for node in nodes)}])",
                "ReturnData": True,
            }
            name = f"{kind}Shard{shard}Alarm"
            names.append(name)
            resources[name] = {
                "Type": "AWS::CloudWatch::Alarm",
                "Condition": shard_condition(shard),
                "Properties": {
                    "AlarmDescription": description.format(shard=shard),
                    "Metrics": [*(node_metric(metric, shard, node) for node in nodes), highest],
                    "EvaluationPeriods": minutes,
                    "DatapointsToAlarm": minutes,
                    "Threshold": above,
                    "ComparisonOperator": "GreaterThanThreshold",
                    "TreatMissingData": "notBreaching",
                    "AlarmActions": [{"Ref": "AlarmTopic"}],
                    "OKActions": [{"Ref": "AlarmTopic"}],
                },
            }
        arns = {"Fn::Sub": ", ".join(f'"${{{name}.Arn}}"' for name in names)}
        # The list is the dashboard's with the cache on nodes, where the first shard always is.
        listed.append(arns if shard == 1 else {"Fn::If": [shard_condition(shard), arns, {"Ref": "AWS::NoValue"}]})
    return {"Conditions": conditions, "Resources": resources}, {"Fn::Join": [", ", listed]}


def package(out: Path, stage: str = "prod", architecture: str = ARCHITECTURE) -> Path:
    """Write merge-template.json, sam.json and deployment.zip, built for `architecture`, into `out`; return the
    template's path."""
    if RUNTIME not in RUNTIMES:
        raise SystemExit(f"this is {RUNTIME}; build the package with one of {', '.join(RUNTIMES)}")
    if architecture not in ARCHITECTURES:
        raise SystemExit(f"no architecture {architecture}: one of {', '.join(ARCHITECTURES)}")
    out.mkdir(parents=True, exist_ok=True)
    merge_file = out / "merge-template.json"
    merge_file.write_text(json.dumps(merge_template(), indent=2) + "\n")
    # Chalice wants a region to start; the template names none (it uses AWS::Region). Its command line tells the
    # app it is only being read (app.py checks no runtime settings then): so does this.
    env = {"AWS_DEFAULT_REGION": "us-east-1", **os.environ, "AWS_CHALICE_CLI_MODE": "true"}
    subprocess.run(
        [sys.executable, "-c", CHALICE_PACKAGE, stage, str(merge_file), str(out), architecture],
        cwd=INFRA.parent,
        env=env,
        check=True,
    )
    template = out / "sam.json"
    built = call_api_alias(json.loads(template.read_text()))
    functions = [r["Properties"] for r in built["Resources"].values() if r["Type"] == "AWS::Serverless::Function"]
    runtimes = {function.get("Runtime") for function in functions}
    if runtimes != {RUNTIME}:
        raise SystemExit(f"chalice wrote runtimes {runtimes}, not this interpreter's {RUNTIME}")
    if any(function.get("Architectures") != [architecture] for function in functions):
        raise SystemExit(f"chalice wrote other architectures than {architecture}")
    template.write_text(json.dumps(built, indent=2) + "\n")
    add_bytecode(out / "deployment.zip")
    return template


def call_api_alias(template: dict) -> dict:
    """Point every API integration at the API function's alias `live` (infra/capacity.yaml), where provisioned
    concurrency lives, instead of its unqualified ARN. Chalice writes each route's URI itself, so it is
    rewritten here rather than repeated route by route in a template piece. (SAM resolves `Ref` to the alias,
    not `${APIHandler.Alias}` inside a `Fn::Sub`.)"""
    alias_uri = {
        "Fn::Join": [
            "",
            [
                "arn:",
                {"Ref": "AWS::Partition"},
                ":apigateway:",
                {"Ref": "AWS::Region"},
                ":lambda:path/2015-03-31/functions/",
                {"Ref": "APIHandler.Alias"},
                "/invocations",
            ],
        ]
    }
    for operations in template["Resources"]["RestAPI"]["Properties"]["DefinitionBody"]["paths"].values():
        for operation in operations.values():
            integration = operation.get("x-amazon-apigateway-integration", {})
            if "${APIHandler.Arn}" in json.dumps(integration.get("uri")):
                integration["uri"] = copy.deepcopy(alias_uri)
    return template


def add_bytecode(zip_path: Path) -> int:
    """Rewrite the zip with `__pycache__/*.pyc` beside every `.py`; the number of modules compiled.

    Bytecode of this interpreter (RUNTIME, the functions' runtime), unchecked-hash (PEP 552): Python loads it
    without comparing the source's time, which the zip keeps only to two seconds. The package never changes once
    built, so nothing can go stale. Bytecode that Chalice copied from a working tree (timestamp-checked, maybe
    stale) is left out.
    """
    rebuilt = zip_path.with_suffix(".tmp")
    with (
        tempfile.TemporaryDirectory() as tmp,
        zipfile.ZipFile(zip_path) as source,
        zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for info in source.infolist():
            if not info.filename.endswith(".pyc"):
                target.writestr(info, source.read(info))
        sources = [name for name in source.namelist() if name.endswith(".py")]
        source.extractall(tmp, members=sources)
        compileall.compile_dir(tmp, quiet=2, workers=0, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        compiled = sorted(Path(tmp).rglob("*.pyc"))
        for pyc in compiled:
            info = zipfile.ZipInfo(pyc.relative_to(tmp).as_posix(), date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            target.writestr(info, pyc.read_bytes())
    rebuilt.replace(zip_path)
    return len(compiled)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", default="prod", help="Chalice stage (.chalice/config.json)")
    parser.add_argument(
        "--architecture", default=ARCHITECTURE, choices=ARCHITECTURES, help="the functions' (.chalice/config.json)"
    )
    parser.add_argument("out", type=Path, help="folder for merge-template.json, sam.json, deployment.zip")
    args = parser.parse_args()
    print(package(args.out, args.stage, args.architecture))

"""The deployment package: `make package` ships the Lua scripts and every dependency, built for the functions'
architecture (arm64), and the unpacked package serves requests through the Lambda entry point the template names
(`app.app`): an x86_64 build of the same code, which this machine can run."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Runs in the unpacked package: one enter and one status request, as API Gateway's proxy events to `app.app`.
PROBE = textwrap.dedent("""
    import json, sys, types
    sys.path.insert(0, ".")
    from pathlib import Path
    import app, chalicelib.scripts
    assert chalicelib.scripts.LUA_DIR.parent == Path.cwd().resolve(), chalicelib.scripts.LUA_DIR

    context = types.SimpleNamespace(
        function_name="api_handler", memory_limit_in_mb=128, aws_request_id="probe",
        invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:api_handler",
        get_remaining_time_in_millis=lambda: 30000,
    )

    def call(method, suffix, headers):
        resource = "/virtual-queues/{queue_type}/{target_id}/entries" + suffix
        event = {
            "resource": resource, "path": "/virtual-queues/limited-drop/1/entries" + suffix, "httpMethod": method,
            "headers": headers, "multiValueHeaders": {k: [v] for k, v in headers.items()},
            "queryStringParameters": None, "multiValueQueryStringParameters": None,
            "pathParameters": {"queue_type": "limited-drop", "target_id": "1"}, "stageVariables": None,
            "requestContext": {"resourcePath": resource, "httpMethod": method, "requestId": "probe", "stage": "api"},
            "body": None, "isBase64Encoded": False,
        }
        answer = app.app(event, context)
        return answer["statusCode"], json.loads(answer["body"])

    status, entered = call("POST", "", {"X-User-Id": "5"})
    assert status == 200, entered
    status, polled = call("GET", "/me", {"X-User-Id": "5", "X-Queue-Ticket": entered["queueTicket"]})
    assert status == 200, polled
    print(entered["status"], polled["status"], polled["position"])
""")


def probe_env(redis_url, prefix, cluster_mode):
    """PROBE's environment: this run's Redis and keys, and nothing of the virtualenv's."""
    return {
        "PATH": os.environ["PATH"],
        "REDIS_URL": redis_url,
        "VQ_KEY_PREFIX": prefix,
        "VQ_REDIS_CLUSTER": "true" if cluster_mode else "false",
        "VQ_TOKEN_KEYS": os.environ["VQ_TOKEN_KEYS"],
        "VQ_TOKEN_ACTIVE_KID": os.environ["VQ_TOKEN_ACTIVE_KID"],
        "VQ_TARGETS_OPEN_ON_FIRST_USE": "true",  # the target opens on its first enter, as locally
        "POWERTOOLS_TRACE_DISABLED": "1",
        "PYTHONNOUSERSITE": "1",
    }


@pytest.fixture
def package(deployment):
    return deployment / "deployment.zip"


@pytest.fixture(scope="module")
def runnable_package(tmp_path_factory):
    """The same package built for this machine's architecture (x86_64), to run it here."""
    from infra.package import package as build

    out = tmp_path_factory.mktemp("x86_64")
    build(out, architecture="x86_64")
    return out / "deployment.zip"


# ELF's e_machine of each architecture (the System V ABI's processor supplements).
ELF_MACHINE = {"arm64": 183, "x86_64": 62}


def machines(package):
    """The architecture of every shared library in `package`, by path."""
    found = {}
    with zipfile.ZipFile(package) as zipped:
        for name in zipped.namelist():
            if name.endswith(".so"):
                header = zipped.read(name)[:20]
                assert header[:4] == b"\x7fELF", name
                found[name] = next(
                    arch for arch, code in ELF_MACHINE.items() if code == int.from_bytes(header[18:20], "little")
                )
    return found


@pytest.mark.slow
def test_package_holds_every_lua_script(package):
    names = set(zipfile.ZipFile(package).namelist())
    scripts = sorted(path.name for path in (ROOT / "lua").glob("*.lua"))
    assert scripts
    for name in scripts:
        assert f"lua/{name}" in names
        assert zipfile.ZipFile(package).read(f"lua/{name}") == (ROOT / "lua" / name).read_bytes()
    assert "app.py" in names and "chalicelib/store.py" in names


@pytest.mark.slow
@pytest.mark.parametrize(
    "extension",
    [
        f"hiredis/hiredis.cpython-{sys.version_info.major}{sys.version_info.minor}-aarch64-linux-gnu.so",
        f"orjson/orjson.cpython-{sys.version_info.major}{sys.version_info.minor}-aarch64-linux-gnu.so",
        "cryptography/hazmat/bindings/_rust.abi3.so",
    ],
)
def test_package_holds_c_extensions_built_for_the_functions_arm64_runtime(package, template, extension):
    # hiredis (redis-py packs commands and parses replies with it when it can import it), orjson (the API's
    # answers) and cryptography (the JWTs' signatures) are C extensions: the package must hold the manylinux
    # aarch64 build for the runtime's Python (chalice package targets this one's), as every function runs on arm64.
    functions = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::Function"]
    assert {tuple(function["Architectures"]) for function in functions} == {("arm64",)}
    built_for = machines(package)
    assert built_for[extension] == "arm64"
    assert set(built_for.values()) == {"arm64"}  # no library of another architecture, which Lambda could not load
    names = zipfile.ZipFile(package).namelist()
    project = extension.partition("/")[0]
    wheel = next(name for name in names if name.startswith(f"{project}-") and name.endswith(".dist-info/WHEEL"))
    tags = zipfile.ZipFile(package).read(wheel).decode()
    assert "-manylinux" in tags and "aarch64" in tags and "x86_64" not in tags


@pytest.mark.slow
def test_the_runnable_build_differs_only_in_its_libraries_architecture(package, runnable_package):
    arm64, x86_64 = machines(package), machines(runnable_package)
    assert set(arm64.values()) == {"arm64"} and set(x86_64.values()) == {"x86_64"}
    same = {name.replace("aarch64", "x86_64") for name in arm64}
    assert same == set(x86_64)
    names = zipfile.ZipFile(package).namelist()
    code = {name for name in names if name.startswith(("app.py", "chalicelib/", "lua/")) and not name.endswith(".pyc")}
    assert "app.py" in code and "lua/status.lua" in code
    for name in code:
        assert zipfile.ZipFile(package).read(name) == zipfile.ZipFile(runnable_package).read(name), name


@pytest.mark.slow
def test_package_holds_the_pages_and_not_the_operator_cli(package):
    # The waiting room's client library too: the committed bundle (clients/js/test/bundle.test.mjs: a fresh build).
    for page in ("waiting-room.html", "waiting-room.js", "virtual-queue.min.js", "console.html", "console.js"):
        path = f"chalicelib/static/{page}"
        assert zipfile.ZipFile(package).read(path) == (ROOT / path).read_bytes()
    # vq (infra/vq/) is the operator's tool: the functions neither import nor ship it.
    names = zipfile.ZipFile(package).namelist()
    assert not [name for name in names if name.startswith("infra/") or "/vq/" in name]


@pytest.mark.slow
def test_unpacked_package_serves_enter_and_status(runnable_package, tmp_path, redis_url, prefix, cluster_mode):
    zipfile.ZipFile(runnable_package).extractall(tmp_path)
    env = probe_env(redis_url, prefix, cluster_mode)
    # -I -S: no site-packages, so nothing from this checkout or the virtualenv's site-packages can stand in
    # for the package.
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "WAITING WAITING 1"


@pytest.mark.slow
def test_package_holds_bytecode_that_a_read_only_import_uses(package, runnable_package, tmp_path):
    names = zipfile.ZipFile(package).namelist()
    sources = [name for name in names if name.endswith(".py")]
    tag = sys.implementation.cache_tag  # the functions' runtime is this interpreter's (infra/package.py checks)
    compiled = {name for name in names if name.endswith(".pyc")}
    assert len(compiled) == len(set(compiled)) == len(sources) > 500
    for source in sources:
        folder, _, module = source.rpartition("/")
        assert f"{folder + '/' if folder else ''}__pycache__/{module[:-3]}.{tag}.pyc" in compiled, source

    # Unpacked read-only, as Lambda mounts it: the bytecode is used, nothing is compiled again.
    zipfile.ZipFile(runnable_package).extractall(tmp_path)
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    env = {
        "PATH": os.environ["PATH"],
        "VQ_TOKEN_KEYS": os.environ["VQ_TOKEN_KEYS"],
        "VQ_TOKEN_ACTIVE_KID": os.environ["VQ_TOKEN_ACTIVE_KID"],
        "POWERTOOLS_TRACE_DISABLED": "1",
    }
    try:
        result = subprocess.run(
            [sys.executable, "-I", "-S", "-v", "-c", "import sys; sys.path.insert(0, '.'); import app"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        for path in [tmp_path, *tmp_path.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)  # so that pytest can clean up
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = result.stderr
    assert f"chalicelib/__pycache__/store.{tag}.pyc matches" in loaded
    assert f"redis/__pycache__/client.{tag}.pyc matches" in loaded
    assert not re.search(r"# code object from '[^']*\.py'", loaded)  # no module compiled from source


def other_python(version: str) -> Path | None:
    """An interpreter of `version` ("3.13") besides the suite's: on PATH, else pyenv's."""
    found = shutil.which(f"python{version}")
    candidates = [Path(found)] if found else []
    candidates += sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}"))
    for candidate in candidates:
        check = subprocess.run([str(candidate), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True)
        if check.returncode == 0:
            return candidate
    return None


@pytest.mark.slow
# With the suite's own 3.11: two runtimes every CI run. VQ_PACKAGE_PYTHONS="3.12 3.13" builds more.
@pytest.mark.parametrize("version", os.environ.get("VQ_PACKAGE_PYTHONS", "3.13").split())
def test_a_package_built_with_another_python_targets_its_runtime_and_serves(
    version, tmp_path, redis_url, prefix, cluster_mode
):
    python = other_python(version)
    if python is None:
        if os.environ.get("CI"):
            pytest.fail(f"Python {version} is missing: CI must test a second runtime")
        pytest.skip(f"no Python {version} here")
    # The build's own virtualenv: the functions' dependencies (Chalice imports app.py) and Chalice.
    venv = tmp_path / "venv"
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True)
    # Chalice's pin, from the local stack's requirements (what `make run` and `make package` use).
    pins = (ROOT / "requirements-run.txt").read_text().splitlines()
    chalice = next(line for line in pins if line.startswith("chalice"))
    subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
            "requirements.txt",
            chalice.split("#")[0].strip(),
        ],
        cwd=ROOT,
        check=True,
    )
    out = tmp_path / "build"
    subprocess.run(
        [str(venv / "bin" / "python"), "infra/package.py", "--architecture", "x86_64", str(out)], cwd=ROOT, check=True
    )

    tag = version.replace(".", "")
    template = json.loads((out / "sam.json").read_text())
    functions = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::Function"]
    runtimes = {function["Runtime"] for function in functions}
    assert runtimes == {f"python{version}"}
    names = zipfile.ZipFile(out / "deployment.zip").namelist()
    for extension in ("hiredis/hiredis", "orjson/orjson"):
        assert f"{extension}.cpython-{tag}-x86_64-linux-gnu.so" in names
    assert f"chalicelib/__pycache__/store.cpython-{tag}.pyc" in names

    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(out / "deployment.zip").extractall(unpacked)
    env = probe_env(redis_url, prefix, cluster_mode)
    result = subprocess.run(
        [str(python), "-I", "-S", "-c", PROBE], cwd=unpacked, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "WAITING WAITING 1"

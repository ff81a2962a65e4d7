"""The deployment package: `chalice package` ships the Lua scripts, and the unpacked package runs them."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("package")
    chalice = Path(sys.executable).parent / "chalice"
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    subprocess.run([str(chalice), "package", str(out)], cwd=ROOT, env=env, check=True, capture_output=True)
    return out / "deployment.zip"


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
def test_unpacked_package_loads_and_runs_its_scripts(package, tmp_path, redis_url, prefix):
    zipfile.ZipFile(package).extractall(tmp_path)
    probe = (
        "import app, chalicelib.store as s, chalicelib.runtime as r;"
        "assert s.LUA_DIR.parent == __import__('pathlib').Path.cwd().resolve(), s.LUA_DIR;"
        "print(r.waiting_room().enter(__import__('chalicelib.targets').targets.Target('limited-drop', 1), 5).status)"
    )
    env = {
        "PATH": os.environ["PATH"], "REDIS_URL": redis_url, "VQ_KEY_PREFIX": prefix,
        "VQ_TOKEN_KEYS": os.environ["VQ_TOKEN_KEYS"], "VQ_TOKEN_ACTIVE_KID": os.environ["VQ_TOKEN_ACTIVE_KID"],
        "POWERTOOLS_TRACE_DISABLED": "1", "PYTHONNOUSERSITE": "1",
    }
    # -I -S: no site-packages, so nothing from this checkout or the virtualenv's site-packages can stand in for the package.
    result = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, '.'); {probe}"],
                            cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "WAITING"

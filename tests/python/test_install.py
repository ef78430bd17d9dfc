"""docs/python.md's install command works on this machine with no package index: a virtual
environment with the system site packages, then pip install --no-build-isolation of
./python, which generates the stubs from proto/ as it builds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import REPO


def test_pip_install_into_a_venv(server, tmp_path) -> None:
    # A copy laid out as the repository is (setup.py finds ../proto, ../types and the
    # version in ../CMakeLists.txt), so that pip's in-tree build leaves no build/ or
    # egg-info in the checkout.
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "python", repo / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copytree(REPO / "proto", repo / "proto")
    shutil.copytree(REPO / "types", repo / "types")
    shutil.copyfile(REPO / "CMakeLists.txt", repo / "CMakeLists.txt")
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL")}
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, env=env)
    install = subprocess.run(
        [str(venv / "bin/pip"), "install", "--no-index", "--no-build-isolation",
         "./python"], cwd=repo, env=env, capture_output=True, text=True)
    assert install.returncode == 0, install.stdout + install.stderr

    probe = ("import qparams, qparams.v1.qparams_pb2 as pb; print(qparams.__file__); "
             "c = qparams.Client(); print(c.health()); "
             "print(c.compute(__import__('numpy').arange(4, dtype='float32')).scale)")
    run = subprocess.run([str(venv / "bin/python"), "-c", probe], cwd=tmp_path,
                         env={**env, "QPARAMS_TARGET": server.target},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    where, health, scale = run.stdout.splitlines()
    assert where.startswith(str(venv)) and health == "SERVING" and scale == "[0.02352941]"

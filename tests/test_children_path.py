"""Every child the tool starts imports the package its parent runs (issue 41, item 1).

Run from inside a source checkout after a non-editable `pip install .`, `mgpu-bench check` ended
"unknown, exit 2": its measuring child ran `python -m mgpu_bench.cli`, Python put the working
folder first on sys.path, and the child imported the checkout's uninstalled tree (no native
module). The tests here build that for real: a virtual environment (no pip, the dev
environment's libraries through a .pth line) holding a copy of the package with its native
module, and a "checkout" folder whose mgpu_bench is a decoy that marks that it was imported and
then fails. The dev tree's own editable install is not used (its import hook would find the
package whatever the working folder holds). That every process the tool starts goes through
children.child_env() or children.spawning(), where import_env() is applied, is
tests/test_signals.py's test_every_child_process_and_temporary_folder_of_the_tool_is_bound_to_its_run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import scaled

import mgpu_bench
from mgpu_bench.core import children

DECOY = '''import os
with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "decoy-imported"), "a") as f:
    f.write(f"{os.getpid()}\\n")
raise ImportError("the decoy mgpu_bench of the working folder was imported")
'''
ENTRY = "import sys\nfrom mgpu_bench.cli import main\nsys.exit(main())\n"  # as pip's console script does


def _package_copy(into: Path) -> Path:
    """A complete copy of this package (its native module and build configuration included) in
    `into`/mgpu_bench."""
    src = Path(mgpu_bench.__file__).parent
    dest = into / "mgpu_bench"
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    built = Path(mgpu_bench._native.__file__).parent  # the editable install keeps them in site-packages
    for f in (*built.glob("_native*.so"), *built.glob("_build_config.py")):
        if not (dest / f.name).exists():
            shutil.copy2(f, dest / f.name)
    return dest


def _venv(where: Path, with_package: bool) -> Path:
    """A virtual environment without pip that sees the dev environment's libraries (torch, click)
    through a .pth line (not as a site folder: the editable install's import hook stays out), and,
    `with_package`, a copy of mgpu_bench in its own site-packages (pip install . puts it there).
    Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=scaled(120))
    site = where / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    import click

    (site / "dev-libraries.pth").write_text(str(Path(click.__file__).parent.parent) + "\n")
    if with_package:
        _package_copy(site)
    return where / "bin" / "python"


def _env() -> dict:
    """No PYTHONPATH or safe-path setting of the test run's own; no GPU, no launcher."""
    drop = ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHONHOME", children.ENV, children.PYTHON_ENV, children.COMMAND_ENV,
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "MGPU_BENCH_DB")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM", "TORCHELASTIC"))}
    return {**env, "CUDA_VISIBLE_DEVICES": ""}


def _where_imported(python: Path, cwd: Path, env: dict) -> str:
    code = "import mgpu_bench; print(mgpu_bench.__file__)"
    out = subprocess.run([str(python), "-P", "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=scaled(120), check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _check(cmd: list[str], cwd: Path, env: dict) -> tuple[subprocess.CompletedProcess, dict]:
    """`check` on CPU (its measuring child, and that child's rank process), its result read back."""
    result = cwd.parent / f"check-{len(list(cwd.parent.glob('check-*.json')))}.json"
    out = subprocess.run([*cmd, "check", "--budget", "40s", "--no-store", "--no-progress", "--json", str(result)],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=scaled(180), check=False)
    doc = json.loads(result.read_text()) if result.exists() else {}
    return out, doc


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("children-path")
    checkout = root / "checkout"  # the source tree the user cd'd into: its package cannot be imported
    (checkout / "mgpu_bench").mkdir(parents=True)
    (checkout / "mgpu_bench" / "__init__.py").write_text(DECOY)
    (checkout / "mgpu_bench" / "cli.py").write_text("raise SystemExit('the decoy cli ran')\n")
    return root


def test_check_from_inside_a_source_checkout_runs_the_installed_package(world):
    """`pip install .` then `mgpu-bench check` in the checkout: the console script runs the
    installed package, and so does every process below it (the check's measuring process and its
    rank process), not the working folder's decoy."""
    python = _venv(world / "installed", with_package=True)
    script = world / "installed" / "bin" / "mgpu-bench"
    script.write_text(ENTRY)
    env = _env()
    installed = _where_imported(python, world, env)
    assert installed.startswith(str(world / "installed")), installed  # the parent's package: the copy
    out, doc = _check([str(python), str(script)], world / "checkout", env)
    marker = world / "checkout" / "decoy-imported"  # the decoy writes it beside its package folder
    assert not marker.exists(), f"the decoy was imported by the processes {marker.read_text().split()}"
    assert out.returncode == 0, out.stdout + out.stderr
    assert doc["verdict"]["state"] == "ok", doc.get("verdict")
    assert {p["part"]: p["status"] for p in doc["parts"]}["ranks"] == "measured"  # the rank process ran too


def test_a_source_tree_run_with_python_m_hands_its_package_to_its_children(world):
    """`python -m mgpu_bench.cli check` from a tree that is not installed (its package found only
    because the working folder comes first): the children find that same package, through the
    PYTHONPATH that import_env() gives them, although they start with the safe path."""
    python = _venv(world / "bare", with_package=False)
    tree = world / "tree"
    tree.mkdir()
    _package_copy(tree)
    env = _env()
    out, doc = _check([str(python), "-m", "mgpu_bench.cli"], tree, env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert doc["verdict"]["state"] == "ok", doc.get("verdict")
    assert {p["part"]: p["status"] for p in doc["parts"]}["ranks"] == "measured"


def test_the_child_gets_the_user_s_own_python_variables_back(tmp_path):
    """The safe path and the package folder are for starting the child only: once it has imported
    mgpu_bench, its environment (what a user model's own subprocess would get) is the user's
    again, and what the child starts in turn is handed the package again."""
    code = ("import json, os, mgpu_bench\nfrom mgpu_bench import children\n"
            "print(json.dumps([os.environ.get('PYTHONSAFEPATH'), os.environ.get('PYTHONPATH'),"
            " children.PYTHON_ENV in os.environ, children.child_env()['PYTHONSAFEPATH']]))")
    for user in ({}, {"PYTHONPATH": str(tmp_path)}, {"PYTHONPATH": str(tmp_path), "PYTHONSAFEPATH": ""}):
        env = children.child_env({**_env(), **user})
        assert env["PYTHONSAFEPATH"] == "1"
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=scaled(120), check=False)
        assert out.returncode == 0, out.stderr
        safe, path, leftover, again = json.loads(out.stdout)
        assert (safe, path) == (user.get("PYTHONSAFEPATH"), user.get("PYTHONPATH")), (user, safe, path)
        assert leftover is False and again == "1"


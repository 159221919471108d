"""The Contributing page's picture of the package's layout (docs/hooks/layout.py): drawn from the tree
as it is, every folder, file and arrow between folders in it; a module added to a copy of the package
shows up in the copy's picture; and a layer order broken in a copy (an import pointing up, an import
cycle between folders, a folder with no place in the order) stops `mkdocs build --strict`.

The built site's own picture, its table and how Chromium shows them: tests/test_docs.py."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import layout  # docs/hooks/layout.py, as the docs hook and tests/test_layers.py import it

SVG = "{http://www.w3.org/2000/svg}"


def _texts(picture: str) -> list[str]:
    """Every text and title of an SVG, parsed as XML (a picture that is not well-formed fails here)."""
    tree = ElementTree.fromstring(picture)
    return [e.text or "" for e in tree.iter() if e.tag in (f"{SVG}text", f"{SVG}title")]


def _copy(tmp_path: Path) -> Path:
    """A copy of the package's sources to change: tmp_path/mgpu_bench."""
    pkg = tmp_path / "mgpu_bench"
    shutil.copytree(layout.PKG, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    return pkg


@pytest.fixture(scope="module")
def read() -> layout.Layout:
    return layout.read()


def test_the_picture_holds_every_folder_file_and_arrow_of_the_tree(read):
    texts = _texts(layout.svg(read))
    folders = sorted(p.name for p in layout.PKG.iterdir() if (p / "__init__.py").is_file())
    assert len(folders) >= 11 and "probes" in folders and "core" in folders
    assert all(f"{name}/" in texts for name in folders), [f for f in folders if f"{f}/" not in texts]
    assert "mgpu_bench/" in texts and "_native" in texts  # the root on top, the compiled module below
    # every module directly in a folder, by name; the probes by their folders (comm/ (15))
    for path in layout.PKG.glob("*/*.py"):
        assert path.name in texts, path
    for path in layout.PKG.glob("probes/*/__init__.py"):
        assert any(t.startswith(f"{path.parent.name}/ (") for t in texts), path.parent.name
    # the arrows: probes import results (the protocol), run imports history; none points up
    arrows = {head for t in texts if " imports " in (head := t.split(":")[0])}
    assert {"probes/ imports results/", "run/ imports history/", "mgpu_bench/ imports run/"} <= arrows
    assert "results/ imports probes/" not in arrows and "core/ imports machine/" not in arrows
    assert len(arrows) == len(read.arrows) > 30
    # the arrow's count is the number of module-to-module imports it stands for
    probes_results = next(t for t in texts if t.startswith("probes/ imports results/"))
    assert re.search(rf": {len(read.arrows['probes', 'results'])} imports ", probes_results)


def test_the_table_says_what_each_folder_holds_from_its_docstring(read):
    rows = layout.table(read).splitlines()[2:]
    assert [r.split("|")[1].strip() for r in rows] == [f"`{f.label}`" for f in read.folders.values()]
    core = next(r for r in rows if r.startswith("| `core/`"))
    assert "The process itself: what every command stands on." in core and "nothing of the package" in core
    probes = next(r for r in rows if r.startswith("| `probes/`"))
    assert "results/ (" in probes and "history/" not in probes  # a probe never imports the history


def test_a_module_added_to_a_copy_shows_up_with_its_arrow(tmp_path):
    pkg = _copy(tmp_path)
    before = layout.read(pkg)
    assert ("training", "core") not in before.arrows  # training/ imports nothing else today
    (pkg / "training" / "fresh_rule.py").write_text(
        '"""A rule added by the test."""\n\nfrom __future__ import annotations\n\n'
        "from mgpu_bench.core.errors import InputError\n\nRULE = InputError\n")
    after = layout.read(pkg)
    texts = _texts(layout.svg(after))
    assert "fresh_rule.py" in texts and "fresh_rule.py" not in _texts(layout.svg(before))
    assert after.arrows["training", "core"] == [("mgpu_bench.training.fresh_rule", "mgpu_bench.core.errors")]
    assert any(t.startswith("training/ imports core/: 1 import ") for t in texts)
    assert after.folders["training"].modules == before.folders["training"].modules + 1
    assert after.folders["training"].lines == before.folders["training"].lines + 7
    assert "core/ (1)" in next(r for r in layout.table(after).splitlines() if r.startswith("| `training/`"))


@pytest.mark.parametrize("change, said", [
    ({"core/upward.py": "from mgpu_bench.probes import comm\n"},
     ["an import pointing up the layer order: mgpu_bench.core.upward (core) imports mgpu_bench.probes.comm (probes)"]),
    ({"machine/lazy.py": "def late():\n    from mgpu_bench.results import probe\n    return probe\n",
      "results/back.py": "from mgpu_bench.machine import lazy\n"},
     ["an import cycle between folders: ", "mgpu_bench.machine.lazy imports mgpu_bench.results.probe",
      "mgpu_bench.machine.lazy (machine) imports mgpu_bench.results.probe (results)"]),
    ({"extra/__init__.py": '"""A folder the order does not know."""\n'},
     ["folders with no place in the layer order: extra"]),
])
def test_a_broken_order_is_named(tmp_path, change, said):
    pkg = _copy(tmp_path)
    assert layout.problems(layout.read(pkg)) == []
    for name, text in change.items():
        (pkg / name).parent.mkdir(exist_ok=True)
        (pkg / name).write_text(text)
    with pytest.raises(layout.LayoutError) as err:
        layout.svg(layout.read(pkg))
    for words in said:
        assert words in str(err.value)


def test_a_broken_order_stops_the_docs_build(tmp_path):
    """The site of a copy of the repository whose core/ imports a probe: mkdocs build --strict exits
    non-zero, naming the import, before it draws anything."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip('mkdocs is not installed: pip install -e ".[docs]"')
    pkg = _copy(tmp_path)
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "core" / "upward.py").write_text("from mgpu_bench.run import runner\n")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(tmp_path / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300, env=env,
                       cwd=tmp_path, check=False)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "mgpu_bench.core.upward (core) imports mgpu_bench.run.runner (run)" in r.stdout + r.stderr
    assert not (tmp_path / "site" / "assets" / "layout.svg").exists()

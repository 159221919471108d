"""The package's layout, read from its code: the one reader of the import graph for the docs and for
tests/test_layers.py, so that the picture on the Contributing page and the test cannot disagree.

- graph(): every mgpu_bench module and the mgpu_bench modules it imports (read with `ast`, nothing is
  imported; lazy imports inside functions count, imports under `if TYPE_CHECKING:` do not).
- ORDER: the folders as layers, from the bottom up. A module may import its own layer and those below
  it, never one above. The compiled module and its loader stand below every folder, the package's
  root (its __init__ and the CLI) above them all (PLACES).
- read(): the folders with their files, line counts and first paragraphs, and the arrows between
  folders; check() says what breaks the order (an import cycle between folders, an arrow that points
  up, a folder with no place in ORDER); svg() and table() draw it for the docs.

The SVG is plain text written here: no graphviz, no fonts or scripts loaded, only the generic
`monospace` family, whose characters are 0.6 em wide (so text widths are known without a font).
Nothing here imports mgpu_bench or mkdocs.
"""

from __future__ import annotations

import ast
import html
import itertools
import math
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "mgpu_bench"

# The layers from the bottom up: a module may import its own layer and those below it, never one above.
# workloads and training stand beside each other (neither imports the other: test_layers); probes reach each
# other only through the registry and no history; history and output import no probe.
ORDER = ("core", "machine", "results", "training", "workloads", "output", "history", "probes", "run", "monitor",
         "suite")
NATIVE = {"_libs", "_native", "_build_config"}  # the compiled module, its loader, the facts CMake writes in-place
PLACES = ("native", *ORDER, "root")  # bottom to top, as the picture stands
SOURCES = ("*.cpp", "*.cu", "*.cuh", "*.hpp", "*.h")  # csrc/: what the compiled module is built from


class LayoutError(Exception):
    """The code breaks the layer order: the docs build stops with this message."""


# -- the import graph --------------------------------------------------------------------------


def module_name(path: Path, pkg: Path = PKG) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(pkg: Path = PKG) -> dict[str, Path]:
    """Dotted name -> file, for every .py file of the package."""
    return {module_name(p, pkg): p for p in sorted(pkg.rglob("*.py")) if "__pycache__" not in p.parts}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of `known` that `name` imports, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING" for b in block.body for n in ast.walk(b)}
    for node in ast.walk(tree):
        if id(node) in typing_only:  # annotations only: no import at run time
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:  # the longest known prefix: a module, or a package's __init__
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (the compiled `_native` included as a target)."""
    mods = modules(pkg)
    known = set(mods) | {f"{pkg.name}._native"}
    g = {name: imports(name, path, known) for name, path in mods.items()}
    # importing a submodule runs its package's __init__ first: not an edge of the code's design
    return {n: {t for t in targets if not n.startswith(t + ".")} for n, targets in g.items()}


def place(module: str) -> str:
    """Where a module stands: "native" (the compiled module and its loader), "root" (the package's
    __init__ and the CLI), else its folder."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "cli":
        return "root"
    return "native" if parts[1] in NATIVE else parts[1]


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of a directed graph as the path that closes it ([a, b, a]), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for t in sorted(edges.get(n, ())):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (found := visit(n)):
            return found
    return None


def against_order(g: Mapping[str, Iterable[str]]) -> list[tuple[str, str]]:
    """The imports that point up PLACES: a module importing one that stands above its own place.
    Places that PLACES does not know are left to check()."""
    bad = []
    for n, targets in g.items():
        for t in targets:
            a, b = place(n), place(t)
            if a in PLACES and b in PLACES and PLACES.index(b) > PLACES.index(a):
                bad.append((n, t))
    return sorted(bad)


# -- the folders -------------------------------------------------------------------------------


@dataclass
class Folder:
    """One place of the picture: its files (a sub-folder counts as one entry) and what it imports."""

    name: str
    about: str  # the first paragraph of its docstring, on one line
    files: list[tuple[str, int, int]]  # (name, modules, lines); a sub-folder's name ends in /
    imports: dict[str, int] = field(default_factory=dict)  # place -> how many module-to-module imports

    @property
    def modules(self) -> int:
        return sum(m for _, m, _ in self.files)

    @property
    def lines(self) -> int:
        return sum(n for _, _, n in self.files)

    @property
    def label(self) -> str:
        return {"root": "mgpu_bench/", "native": "_native"}.get(self.name, self.name + "/")


@dataclass
class Layout:
    folders: dict[str, Folder]  # in PLACES order, those present
    arrows: dict[tuple[str, str], list[tuple[str, str]]]  # (from place, to place) -> the module imports
    graph: dict[str, set[str]]


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8", errors="replace").splitlines())


def _about(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n")[0].split())


def read(pkg: Path = PKG) -> Layout:
    """The package at `pkg` as the picture draws it; csrc/ beside it, where there is one, is the
    compiled module's source."""
    g = graph(pkg)
    files: dict[str, list[tuple[str, int, int]]] = {}
    subs: dict[tuple[str, str], list[int]] = {}
    for name, path in modules(pkg).items():
        rel = path.relative_to(pkg).parts
        where = place(name)
        if where in ("root", "native") or len(rel) == 2:
            files.setdefault(where, []).append((rel[-1], 1, _lines(path)))
        else:  # a sub-folder (probes/comm/...): one entry
            tally = subs.setdefault((where, rel[1]), [0, 0])
            tally[0] += 1
            tally[1] += _lines(path)
    for (where, sub), (count, lines) in sorted(subs.items()):
        files.setdefault(where, []).append((sub + "/", count, lines))
    csrc = pkg.parent / "csrc"
    if csrc.is_dir():
        sources = sorted({p for pattern in SOURCES for p in csrc.rglob(pattern)})
        files.setdefault("native", []).append(("csrc/", len(sources), sum(_lines(p) for p in sources)))
    loader = _about(pkg / "_libs.py") if (pkg / "_libs.py").exists() else ""
    abouts = {"root": _about(pkg / "__init__.py"),
              "native": "The compiled module, built from csrc/ (C++ and CUDA)"
                        + (f", and _libs.py, which {loader[:1].lower()}{loader[1:]}" if loader else ".")}
    arrows: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for n, targets in g.items():
        for t in targets:
            if place(n) != place(t):
                arrows.setdefault((place(n), place(t)), []).append((n, t))
    names = [p for p in PLACES if p in files] + sorted(set(files) - set(PLACES))
    folders = {}
    for name in names:
        init = pkg / name / "__init__.py"
        about = abouts.get(name) or (_about(init) if init.exists() else "")
        rows = sorted(files[name], key=lambda f: (f[0] != "__init__.py", f[0].endswith("/"), f[0]))
        folders[name] = Folder(name, about, rows, {b: len(v) for (a, b), v in sorted(arrows.items()) if a == name})
    return Layout(folders, {k: sorted(v) for k, v in sorted(arrows.items())}, g)


def problems(layout: Layout) -> list[str]:
    """What breaks the order, one line each: [] when the layout holds."""
    out = []
    unknown = [f for f in layout.folders if f not in PLACES]
    if unknown:
        out.append(f"folders with no place in the layer order: {', '.join(unknown)} (add them to ORDER in "
                   "docs/hooks/layout.py, where they stand)")
    cycle = find_cycle({a: {b for (x, b) in layout.arrows if x == a} for (a, _) in layout.arrows})
    if cycle:
        out.append("an import cycle between folders: " + " -> ".join(cycle) + " ("
                   + "; ".join(f"{n} imports {t}" for a, b in itertools.pairwise(cycle) for n, t in layout.arrows[a, b][:2])
                   + ")")
    for n, t in against_order(layout.graph):
        out.append(f"an import pointing up the layer order: {n} ({place(n)}) imports {t} ({place(t)})")
    return out


def check(layout: Layout) -> Layout:
    """The layout, or LayoutError naming every import that breaks the order."""
    found = problems(layout)
    if found:
        raise LayoutError("the package's layout breaks its layer order (docs/hooks/layout.py):\n  "
                          + "\n  ".join(found))
    return layout


# -- the picture -------------------------------------------------------------------------------

FONT = 12  # px, monospace: a character is 0.6 em wide
CHAR = 0.6 * FONT
SMALL = 11  # px, the folders' first sentence
COLUMNS, CELL = 3, 30  # files per row, characters per file
PAD = 10  # px inside a box
BOX_W = COLUMNS * CELL * CHAR + 2 * PAD  # 668 px
GAP = 16  # px between boxes
LANE = 10  # px between the vertical runs of two arrows
MARGIN = 16  # px around the drawing
# One colour per place (matplotlib's tab10 without its grey, then four of tab20b's darker ones): a folder's box and the
# arrows that leave it, so that what a folder imports is followed by colour.
PALETTE = ("#7b4173", "#1f77b4", "#ff7f0e", "#2ca02c", "#17becf", "#bcbd22", "#8c564b", "#9467bd", "#d62728",
           "#e377c2", "#393b79", "#637939", "#843c39")


def _colour(name: str) -> str:
    return PALETTE[PLACES.index(name) % len(PALETTE)]


def _sentence(text: str) -> str:
    """The first sentence: what the folder holds, before what it may import."""
    head, dot, _ = text.partition(". ")
    return head + "." if dot else text


def _text(x: float, y: float, s: str, size: int = FONT, anchor: str = "start", fill: str = "#222",
          weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}" '
            f'font-weight="{weight}">{html.escape(s)}</text>')


def _lanes(spans: list[tuple[int, int]]) -> list[int]:
    """A lane per span (top row, bottom row): the shortest spans nearest the boxes, a lane shared by
    spans that do not overlap (two that meet at a box use its upper and lower half)."""
    lanes: list[list[tuple[int, int]]] = []
    out = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: (spans[i][1] - spans[i][0], spans[i])):
        a, b = spans[i]
        lane = next((k for k, used in enumerate(lanes) if all(b <= c or a >= d for c, d in used)), len(lanes))
        if lane == len(lanes):
            lanes.append([])
        lanes[lane].append((a, b))
        out[i] = lane
    return out


def svg(layout: Layout) -> str:
    """The layout as an SVG: a box per folder, the top layer first, its files with their line counts;
    an arrow from each folder to each one it imports, on the right, as wide as the imports are many.
    Raises LayoutError where the layout breaks its order (an arrow would point up)."""
    check(layout)
    stack = list(reversed(layout.folders))  # top to bottom
    row = {name: i for i, name in enumerate(stack)}
    arrows = [(a, b, len(v)) for (a, b), v in layout.arrows.items()]
    lanes = _lanes([(row[a], row[b]) for a, b, _ in arrows])
    x0 = MARGIN
    right = x0 + BOX_W
    body: list[str] = []
    heights, tops = {}, {}
    y = MARGIN
    for name in stack:
        f = layout.folders[name]
        about = textwrap.wrap(_sentence(f.about), int((BOX_W - 2 * PAD) / (0.6 * SMALL))) or [""]
        rows = math.ceil(len(f.files) / COLUMNS)
        ends = sum(1 for a, b, _ in arrows if name in (a, b))
        h = max(PAD + 18 + 15 * len(about) + 16 * rows + PAD, 12 + 9 * ends)
        tops[name], heights[name] = y, h
        y += h + GAP
    height = y - GAP + MARGIN
    # the ends of the arrows on each box's right side: those arriving above those leaving (no arrow
    # crosses another at its own box), the inner lanes nearest the corner each comes from
    ends: dict[int, tuple[float, float]] = {}
    for name in stack:
        arriving = sorted((lanes[i], i) for i, (a, b, _) in enumerate(arrows) if b == name)
        leaving = sorted(((-lanes[i], i) for i, (a, b, _) in enumerate(arrows) if a == name))
        order = [("in", i) for _, i in arriving] + [("out", i) for _, i in leaving]
        step = (heights[name] - 12) / max(len(order), 1)
        for k, (how, i) in enumerate(order):
            at = tops[name] + 6 + step * (k + 0.5)
            start, end = ends.get(i, (0.0, 0.0))
            ends[i] = (at, end) if how == "out" else (start, at)
    for name in stack:
        f, top, h, colour = layout.folders[name], tops[name], heights[name], _colour(name)
        body.append(f'<g><title>{html.escape(f.label)}: {html.escape(f.about)}</title>')
        body.append(f'<rect x="{x0}" y="{top}" width="{BOX_W:.1f}" height="{h}" rx="5" fill="{colour}" '
                    f'fill-opacity="0.07" stroke="{colour}" stroke-width="1.5"/>')
        body.append(f'<rect x="{x0}" y="{top}" width="6" height="{h}" rx="2" fill="{colour}"/>')
        body.append(_text(x0 + PAD + 2, top + PAD + 12, f.label, 14, weight="bold"))
        summary = f"{f.modules} module{'s' * (f.modules != 1)}, {f.lines:,} lines"
        if f.name == "native":
            summary = f"{f.lines:,} lines"
        body.append(_text(right - PAD, top + PAD + 12, summary, SMALL, "end", "#555"))
        about = textwrap.wrap(_sentence(f.about), int((BOX_W - 2 * PAD) / (0.6 * SMALL))) or [""]
        for k, line in enumerate(about):
            body.append(_text(x0 + PAD + 2, top + PAD + 30 + 15 * k, line, SMALL, fill="#444"))
        first = top + PAD + 30 + 15 * len(about) + 2
        cell = CELL * CHAR
        for k, (fname, count, lines) in enumerate(f.files):
            cx, cy = x0 + PAD + 2 + (k % COLUMNS) * cell, first + 16 * (k // COLUMNS)
            shown = fname if count == 1 or not fname.endswith("/") else f"{fname} ({count})"
            body.append(_text(cx, cy, shown))
            body.append(_text(cx + cell - 14, cy, f"{lines:,}", SMALL, "end", "#777"))
        body.append("</g>")
    widest = 0.0
    for i, (a, b, count) in enumerate(arrows):
        colour, (ys, yd) = _colour(a), ends[i]
        lx = right + 14 + LANE * lanes[i]
        widest = max(widest, lx)
        r = min(6.0, abs(yd - ys) / 2)
        down = 1 if yd > ys else -1
        width = 0.8 + 0.45 * math.log2(count)
        d = (f"M{right:.1f},{ys:.1f} H{lx - r:.1f} Q{lx:.1f},{ys:.1f} {lx:.1f},{ys + down * r:.1f} "
             f"V{yd - down * r:.1f} Q{lx:.1f},{yd:.1f} {lx - r:.1f},{yd:.1f} H{right + 8:.1f}")
        example = ", ".join(f"{n} imports {t}" for n, t in layout.arrows[a, b][:3])
        body.append(f'<g><title>{html.escape(layout.folders[a].label)} imports '
                    f'{html.escape(layout.folders[b].label)}: {count} import{"s" * (count != 1)} '
                    f'({html.escape(example)}{", ..." if count > 3 else ""})</title>')
        body.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{width:.2f}" stroke-opacity="0.85"/>')
        body.append(f'<circle cx="{right + 2.5:.1f}" cy="{ys:.1f}" r="2.5" fill="{colour}"/>')
        body.append(f'<polygon points="{right:.1f},{yd:.1f} {right + 9:.1f},{yd - 4.5:.1f} {right + 9:.1f},'
                    f'{yd + 4.5:.1f}" fill="{colour}"/>')
        body.append("</g>")
    width = max(widest, right) + MARGIN + 4
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace">\n'
            "<title>mgpu_bench: its folders as layers, the top layer first, and the imports between them</title>\n"
            f'<rect width="{width:.0f}" height="{height:.0f}" fill="#fff"/>\n' + "\n".join(body) + "\n</svg>\n")


def table(layout: Layout) -> str:
    """The folders from the bottom layer up, as a Markdown table: what each holds (its docstring's
    first paragraph), its modules and lines, and the folders it imports (how many imports each)."""

    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    out = ["| folder | what it holds | modules | lines | imports (how many imports) |", "|---|---|--:|--:|---|"]
    for f in layout.folders.values():
        mods = str(f.modules)
        if f.name == "native":  # its Python files, and the sources of the compiled module
            python = sum(m for n, m, _ in f.files if n.endswith(".py"))
            mods = f"{python} (and {f.modules - python} C++ and CUDA files in csrc/)"
        uses = ", ".join(f"{layout.folders[b].label} ({n})" for b, n in
                         sorted(f.imports.items(), key=lambda kv: PLACES.index(kv[0]) if kv[0] in PLACES else 0))
        out.append(f"| `{f.label}` | {cell(f.about)} | {mods} | {f.lines:,} | {cell(uses) or 'nothing of the package'} |")
    return "\n".join(out) + "\n"

"""Trims recorded result documents into test fixtures: raw sample arrays cut to their first few
entries, every field kept with its type and shape (issue 23: every GPU document a fixture).

    python benchmarks/trim_fixture.py DOC.json [DOC.json ...] --out tests/fixtures/gpu [--keep 5] [--parts]

--parts: a suite document's probe documents are written as fixtures of their own too, each as
NAME--PROBE.json (suite-quick-1xh200--max-batch.json): a suite holds documents of commands the
smoke run does not run alone (memory --max-batch 350m, the sustained runs).

What is cut, wherever it sits (a suite's probe documents included):
- lists of raw samples under the keys in SAMPLES (per-iteration, per-burst, per-copy and per-step
  seconds, NVML series, the torch allocator's per-step bytes, a sustained GEMM's series, the
  fleet's per-burst figures): their first --keep entries, plus the first entry of each kind of
  value those leave out (a None where NVML failed a query), so every type a field holds stays;
  lists of one length side by side (NVML's t, sm_hz, power_w, temp_c) are cut at the same
  positions, and a matrix (comm's samples: one row per rank) keeps every row, each cut alike;
- per-step phases (model's "phases" and "no_sync_phases": data, forward, backward, optimizer,
  step): cut alike, so the phases stay step-aligned;
- the coarse pass of `gemm --search` (results of phase "search"): its first --keep shapes.
Per-rank and per-GPU lists (burst_seconds, wrong, devices, ranks) and the records a reader counts
(measurements, candidates, checks, trials) are kept whole; no field is removed; derived figures
stay as measured (they are the document's, not recomputed from the cut samples).

Each trimmed document is checked against its declared shape (mgpu_bench.results.probe.validate) before
it is written, with the same file name under --out, indented as --json writes it, or on one line
where that stays under 50 KB and indented would not; the sizes before and after are printed, and
a fixture still over 50 KB is said (aim below it: the repository and CI's checkout stay small; a
suite of one H200 stays near 70 KB, most of it its probes' candidates, summaries and findings)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Keys whose list value is raw samples (seconds per iteration/burst/copy/step, NVML readings).
SAMPLES = frozenset({
    "seconds", "samples", "t", "sm_hz", "power_w", "temp_c", "mem_hz", "series", "flops_samples", "copy_samples",
    "step_allocated_bytes", "step_reserved_bytes", "step_seq_lens", "step_ok",
})
# Keys whose value maps names to step-aligned lists (model: per-phase seconds of every step).
STEP_TABLES = frozenset({"phases", "no_sync_phases"})
TARGET_BYTES = 50_000


def _is_scalar(x) -> bool:
    return x is None or isinstance(x, (bool, int, float, str))


def _picks(columns: list[list], keep: int) -> list[int]:
    """Positions to keep of step-aligned lists of one length: the first `keep`, and the first
    position of each kind of value (a None where NVML failed, a float beside ints) that these
    would leave out, so that every type a field holds stays in it."""
    n = len(columns[0])
    picks = set(range(min(keep, n)))
    for col in columns:
        seen = {type(col[i]) for i in picks}
        for i, x in enumerate(col):
            if type(x) not in seen:
                seen.add(type(x))
                picks.add(i)
    return sorted(picks)


def _cut_columns(table: dict, keys, keep: int) -> dict:
    """`table` with its lists under `keys` cut alike, per length (lists of one length are
    step-aligned: NVML's t, sm_hz, power_w, temp_c; a model's phases; the allocator's steps)."""
    out = dict(table)
    groups: dict[int, list[str]] = {}
    for k in keys:
        v = table[k]
        if isinstance(v, list) and v and all(_is_scalar(x) for x in v):
            groups.setdefault(len(v), []).append(k)
    for names in groups.values():
        picks = _picks([table[k] for k in names], keep)
        for k in names:
            out[k] = [table[k][i] for i in picks]
    return out


def _cut_rows(rows: list, keep: int) -> list:
    """A matrix (comm's samples, one row per rank): every row cut alike, so rows stay of one length."""
    by_len: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        if r and all(_is_scalar(x) for x in r):
            by_len.setdefault(len(r), []).append(i)
    out = list(rows)
    for members in by_len.values():
        picks = _picks([rows[i] for i in members], keep)
        for i in members:
            out[i] = [rows[i][j] for j in picks]
    return out


def trim(value, keep: int):
    """`value` with its raw sample arrays cut to `keep` entries (module docs); a new object."""
    if isinstance(value, list):
        return [trim(x, keep) for x in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for k, v in value.items():
        if k in STEP_TABLES and isinstance(v, dict) and v and all(isinstance(x, list) for x in v.values()):
            out[k] = _cut_columns(v, list(v), keep)
        elif k in SAMPLES and isinstance(v, list) and v and all(isinstance(x, list) for x in v):
            out[k] = _cut_rows(v, keep)
        elif k in SAMPLES and isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out[k] = [trim(x, keep) for x in v[:keep]]  # a sustained GEMM's {t, seconds} points
        else:
            out[k] = trim(v, keep)
    out = _cut_columns(out, [k for k in out if k in SAMPLES], keep)
    if out.get("kind") == "gemm" and isinstance(out.get("results"), list):
        search = [r for r in out["results"] if isinstance(r, dict) and r.get("phase") == "search"]
        drop = {id(r) for r in search[keep:]}
        out["results"] = [r for r in out["results"] if id(r) not in drop]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("docs", nargs="+", type=Path, help="result documents (a command's --json, a suite.json)")
    ap.add_argument("--out", type=Path, required=True, help="folder for the trimmed fixtures (same file names)")
    ap.add_argument("--keep", type=int, default=5, help="entries kept of each sample list [default: 5, the fewest "
                                                         "that keep a noise estimate]")
    ap.add_argument("--parts", action="store_true", help="also write a suite's probe documents as their own fixtures")
    args = ap.parse_args(argv)
    if args.keep < 1:
        print("trim_fixture: --keep must be at least 1", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for path in args.docs:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"{path}: not read: {exc}", file=sys.stderr)
            failed += 1
            continue
        if not isinstance(doc, dict) or doc.get("schema") != "mgpu-bench/result":
            print(f"{path}: skipped: not an mgpu-bench result document", file=sys.stderr)
            continue
        failed += not _write(doc, args.out / path.name, args.keep, path.stat().st_size)
        if args.parts and doc.get("kind") == "suite":
            from mgpu_bench.results.schema import file_stem

            for entry in doc.get("probes") or []:
                part = entry.get("document") if isinstance(entry, dict) else None
                if isinstance(part, dict):
                    name = f"{path.stem}--{file_stem(str(entry.get('name')), 'probe')}.json"
                    failed += not _write(part, args.out / name, args.keep, len(json.dumps(part, indent=1)))
    return 1 if failed else 0


def _write(doc: dict, target: Path, keep: int, size_before: int) -> bool:
    """The trimmed `doc` at `target` once it passes its declared shape; False (said) otherwise."""
    from mgpu_bench.results.probe import validate
    from mgpu_bench.results.schema import SchemaError

    small = trim(doc, keep)
    try:
        validate(json.loads(json.dumps(small)), target.name)
    except SchemaError as exc:
        print(f"{target}: the trimmed document fails its shape, not written: {exc}", file=sys.stderr)
        return False
    text, how = json.dumps(small, indent=1) + "\n", "indented"
    if len(text.encode()) > TARGET_BYTES:  # one line, no spaces: about a third smaller
        text, how = json.dumps(small, separators=(",", ":")) + "\n", "compact"
    target.write_text(text)
    size = len(text.encode())
    over = f"; over {TARGET_BYTES // 1000} KB: try a smaller --keep" if size > TARGET_BYTES else ""
    print(f"{target}: {size_before / 1000:.1f} KB -> {size / 1000:.1f} KB ({how}{over})")
    return True


if __name__ == "__main__":
    sys.exit(main())

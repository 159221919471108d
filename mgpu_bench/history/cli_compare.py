"""`mgpu-bench baseline` and `mgpu-bench compare`: the run each kind is compared with by default,
and the regression check a cron job or CI can gate on (its exit codes below, and in its --help).
Bad input raises InputError, which the main group turns into one line on stderr and exit code 2.
"""

from __future__ import annotations

import math

import click

from mgpu_bench.core.errors import InputError
from mgpu_bench.core.paths import check_distinct, check_writable
from mgpu_bench.output.console import safe_text
from mgpu_bench.output.tables import format_value
from mgpu_bench.results.numbers import ascii_float, foreign_digit

from .cli_common import HelpGroup, _db, _db_option, _open, _out, format_change, format_noise

EXIT_REGRESSION = 1
# compare only: the comparison was made and printed, no regression, but --json was not written.
# Not 1 (a regression gate must not fire on a full disk) nor 2 (the input was good).
EXIT_OUTPUT = 3
# compare only: no regression, but a change too close to the noise to call either way (a gate can
# say neither passed nor failed); a regression still exits 1.
EXIT_CANNOT_TELL = 4


def parse_tolerance(text: str) -> float:
    """'5%' or '0.05' -> 0.05; must be more than 0 and less than 100%."""
    t = str(text).strip()
    number = ascii_float(t.removesuffix("%"))  # ASCII digits only: float() reads '５'
    if number is None:
        digit = foreign_digit(t)
        raise InputError(
            f"--tolerance '{text}' is not a number"
            + (f" (it has the digit {digit!r}, not one of 0-9)" if digit else "")
            + ": write 5% or 0.05"
        )
    value = number / 100 if t.endswith("%") else number
    if not (math.isfinite(value) and 0 < value < 1):
        raise InputError(
            f"--tolerance '{text}' must be more than 0 and less than 100%: write e.g. 5% or 0.05"
        )
    return value


# -- baseline ---------------------------------------------------------------------------------


@click.group("baseline", cls=HelpGroup)
def baseline_group() -> None:
    """The run each kind is compared with by default (`mgpu-bench compare`)."""


@baseline_group.command("set")
@click.argument("run")
@_db_option
def baseline_set(run, db_path) -> int:
    """Makes RUN (r12, 12 or latest) the baseline of its kind, replacing the previous one."""
    with _open(db_path, create=False) as h:
        run_id = h.resolve(run)
        kind = h.set_baseline(run_id)
    _out().print(safe_text(f"{run_id} is now the baseline for {kind} runs"))
    return 0


@baseline_group.command("show")
@click.option("--kind", default=None, help="Only this kind's baseline.")
@_db_option
def baseline_show(kind, db_path) -> int:
    """The baseline run of each kind (exit code 2 when --kind has none)."""
    out = _out()
    with _open(db_path, readonly=True) as h:
        if kind is not None:
            run_id = h.baseline(kind)
            if run_id is None:
                raise InputError(
                    f"no baseline for {kind} runs: set one with `mgpu-bench baseline set RUN`"
                )
            items = {kind: run_id}
        else:
            items = h.baselines()
        if not items:
            out.print(safe_text(
                f"no baselines set in {h.path}: set one with `mgpu-bench baseline set RUN`"
            ))
            return 0
        for k, run_id in items.items():
            rec = h.get(run_id)
            out.print(safe_text(f"{k}: {run_id} (created {rec.created}, host {rec.host or '-'})"))
    return 0


# -- compare ----------------------------------------------------------------------------------

_COMPARE_HELP = """Compares a stored run with a baseline, metric by metric.

\b
RUN and --baseline: r12 (as `history list` prints it), 12, or latest. Without --baseline,
the baseline set for RUN's kind (`mgpu-bench baseline set`).
Per metric: change = (new - base) / base; fractions (MFU, shares) change in percentage
points. Noise of a run = 1.4826 x MAD / median of the metric's own samples (iterations,
steps, bursts), none with fewer than 5. Up to --tolerance a change is "unchanged". Beyond it
a metric is a regression when it is worse by more than max(--tolerance, 3 x the larger noise
of the two runs) (ratios as |ln(new / base)|, so a 10x drop counts as far as a 10x gain), an
improvement when better by as much, "within noise" when inside one noise, and "cannot tell"
in between: larger than the runs' spread, too small against it to call. On a host too noisy
to compare (a CPU run started on a busy host, or figures spreading over 10% within a run)
each metric's noise is at least that run's typical spread (said). Differences of host, GPUs,
driver, CUDA, NCCL, torch, NCCL_*/CUDA_* variables or topology between the two runs are
printed first as a warning.

\b
Exit codes: 0 no regression and nothing undecided; 1 at least one regression, or runs that
cannot be compared (gate cron jobs and CI on it); 2 bad input (unknown run, no baseline, bad
--tolerance, an unusable database, a --json path that cannot be written: checked before
comparing); 3 compared without a regression, but --json could not be written afterwards (a
full disk must not read as a regression; a regression still exits 1, with the write failure
said); 4 cannot tell: no regression, but a change too close to the noise to call either way
(run both again on a quieter host, or with more steps or iterations).
"""


@click.command("compare", help=_COMPARE_HELP)
@click.argument("run")
@click.option(
    "--baseline",
    "base",
    default=None,
    metavar="RUN",
    help="The run to compare with [default: RUN's kind's baseline].",
)
@click.option(
    "--tolerance",
    "tolerance_text",
    default="5%",
    show_default=True,
    help="Changes up to this are unchanged: 5% or 0.05 (more than 0, less than 100%).",
)
@click.option(
    "--json",
    "json_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the comparison (base units, every metric) as JSON.",
)
@_db_option
def compare_command(run, base, tolerance_text, json_path, db_path) -> int:
    from rich.table import Table

    from mgpu_bench.output.console import stdout_failure
    from mgpu_bench.output.tables import print_table

    from .compare import NOISE_K, STATUSES, compare_runs

    tolerance = parse_tolerance(tolerance_text)
    check_writable(json_path, "--json")
    check_distinct([("--json", json_path)], _db(db_path))
    with _open(db_path, readonly=True) as h:
        new = h.get(run)
        if base is None:
            base = h.baseline_of(new)
            if base is None:
                raise InputError(
                    f"no baseline for {new.kind} runs: set one with `mgpu-bench baseline set RUN`, "
                    "or give --baseline RUN"
                )
        result = compare_runs(h, base, new.run_id, tolerance)
    code = EXIT_REGRESSION if result.failed else EXIT_CANNOT_TELL if result.cannot_tell else 0
    if json_path:  # written first, printed after: a reader that stops reading stdout costs no file
        from mgpu_bench.core.paths import write_json

        try:
            write_json(json_path, result.to_dict())
        except OSError as exc:
            code = EXIT_REGRESSION if result.failed else EXIT_OUTPUT
            click.echo(
                safe_text(f"mgpu-bench: compared, but could not write {json_path}: {exc.strerror or exc} "
                          f"(exit code {code}: {'a regression' if result.failed else 'the file is missing'})"),
                err=True,
            )
    out = _out()
    for line in result.not_comparable:
        out.print(safe_text(f"not comparable: {line}"), style="bold red", soft_wrap=True)
    for line in result.fingerprint_differences:
        out.print(
            safe_text(f"warning: {result.base} and {result.new} ran on different setups: {line}"),
            style="bold yellow",
            soft_wrap=True,
        )
    for line in result.warnings:
        out.print(safe_text(f"warning: {line}"), style="bold yellow", soft_wrap=True)
    out.print(
        f"{result.new} against {result.base}: a regression is worse by more than "
        f"max({100 * tolerance:g}%, {NOISE_K:g} x noise)",
        soft_wrap=True,
    )
    t = Table(box=None, pad_edge=False, header_style="bold")
    t.add_column("metric", overflow="fold")
    for name in ("base", "new", "change", "noise"):
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("status", no_wrap=True)
    styles = {"regression": "bold red", "improvement": "green", "missing": "yellow", "cannot tell": "yellow"}
    for c in result.changes:
        t.add_row(
            safe_text(c.name),
            safe_text(format_value(c.base, c.unit)),
            safe_text(format_value(c.new, c.unit)),
            format_change(c.change, c.absolute),
            format_noise(_spread(c), c.absolute),
            c.status,
            style=styles.get(c.status),
        )
    print_table(out, t)
    counts = {s: sum(1 for c in result.changes if c.status == s) for s in STATUSES}
    for c in result.regressions:  # one line each, for grep and mail
        out.print(safe_text(
            f"regression: {c.name} {format_value(c.base, c.unit)} -> {format_value(c.new, c.unit)} "
            f"({format_change(c.change, c.absolute)}, threshold {format_noise(c.threshold, c.absolute)})"),
            soft_wrap=True,
        )
    for c in result.undecided:
        out.print(safe_text(
            f"cannot tell: {c.name} {format_value(c.base, c.unit)} -> {format_value(c.new, c.unit)} "
            f"({format_change(c.change, c.absolute)}: beyond the noise {format_noise(_spread(c), c.absolute)}, under "
            f"the threshold {format_noise(c.threshold, c.absolute)})"),
            soft_wrap=True,
        )
    out.print(", ".join(f"{n} {s}{'s' if n != 1 and s in ('regression', 'improvement') else ''}"
                        for s, n in counts.items()))
    if result.cannot_tell:
        out.print(f"cannot tell (exit code {EXIT_CANNOT_TELL}): {len(result.undecided)} change(s) too close to the "
                  "noise to call; run both again on a quieter host, or longer", soft_wrap=True)
    out.print(f"{result.compared} metric(s) compared, those both runs have; {counts['missing']} only in {result.base}, "
              f"{counts['added']} only in {result.new}", soft_wrap=True)
    if code in (0, EXIT_CANNOT_TELL) and stdout_failure() is not None and not isinstance(stdout_failure(), BrokenPipeError):
        return EXIT_OUTPUT  # compared, no regression, the comparison not printed: never the regression code
    return code


def _spread(c) -> float | None:
    """The noise a change was judged against: the larger of the runs', or a noisy host's floor."""
    known = [x for x in (c.noise_base, c.noise_new, c.floor) if x is not None]
    return max(known) if known else None

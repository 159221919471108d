"""The probe protocol and the registry: what every measuring command is, in one place.

A probe is one folder under `mgpu_bench/probes/<name>/` whose `__init__.py` defines `PROBE`, an
instance of a `Probe` subclass, and one line in `REGISTRY` below. The runner (runner.py) gives
every probe the same flow: options -> a frozen config -> run -> findings -> terminal -> result
document -> files -> history -> exit code, with the same fault rules. The suite, the history,
`mgpu-bench report` and the fleet pass reach probes only through this protocol and the
registry, never by importing a probe's modules.

A probe's `__init__.py` imports nothing heavy at module level (no torch, no native module):
the history reads headline metrics and the CLI builds its options from it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

# Probe name -> the module that defines its PROBE. Adding a probe: a folder and one line here.
REGISTRY: dict[str, str] = {
    "comm": "mgpu_bench.probes.comm",
    "links": "mgpu_bench.probes.links",
    "gemm": "mgpu_bench.probes.gemm",
    "memory": "mgpu_bench.probes.memory",
    "model": "mgpu_bench.probes.model",
    "fleet": "mgpu_bench.probes.fleet",
    "sdc": "mgpu_bench.probes.sdc",
    "overlap": "mgpu_bench.probes.overlap",
    "check": "mgpu_bench.probes.check",
    "suite": "mgpu_bench.suite",
    "plan": "mgpu_bench.probes.plan",
}

PROBLEM, WARNING, OK = "problem", "warning", "ok"
_NO_DEFAULT = object()
MAX_ITERS = 1_000_000  # iteration counts above this are typos
GPUS_HELP = "N for the first N GPUs, or indices 0,1 [default: all visible]."
SEVERITIES = (PROBLEM, WARNING, OK)  # the order findings are listed in


@dataclass(frozen=True)
class Finding:
    """One verdict line: severity (problem, warning or ok) and the text with the figure, the
    expected figure and the likely cause; round and probe name where it came from one probe."""

    severity: str
    text: str
    round: int | None = None
    probe: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """What bounds a training step, as a probe that times one judges it.

    bound: compute, communication, input, memory or none (no verdict); text: the probe's wording
    ("communication-bound: ..."); where: what it covers ("2 GPU(s)"); scale: how many GPUs (the
    suite prefers the widest compute-bound verdict); line: the probe's own finding that says the
    same, left out where the verdict stands as the headline."""

    bound: str
    severity: str
    text: str
    where: str
    scale: int
    line: str


@dataclass(frozen=True)
class PlanContext:
    """What the suite plans for: --quick, the selected CUDA devices ([]: CPU ranks), round 3's
    --duration in seconds and --model (None: each probe's own workload)."""

    quick: bool
    gpus: tuple[int, ...]
    duration_s: float
    model: str | None = None

    @property
    def ngpu(self) -> int:
        return len(self.gpus)

    def gpus_args(self, first: bool = False) -> tuple[str, ...]:
        """--gpus for exactly the selected CUDA devices (or the first of them); () on CPU ranks.
        "N" for the first N, else indices ("3," for one)."""
        gpus = list(self.gpus[:1] if first else self.gpus)
        if not gpus:
            return ()
        if gpus == list(range(len(gpus))):
            return ("--gpus", str(len(gpus)))
        return ("--gpus", ",".join(map(str, gpus)) + ("," if len(gpus) == 1 else ""))


@dataclass(frozen=True)
class Step:
    """One probe run of the suite: a child `mgpu-bench ARGS --json FILE` in `round`, placed by
    `order` within it. `min_gpus` 0: runs on CPU ranks too. `telemetry`: the suite samples NVML
    beside it. `prepare(earlier entries, run_step)` may re-plan the step from what ran before it
    (run_step runs a helper step and returns its entry)."""

    round: int
    order: int
    name: str
    title: str
    args: tuple[str, ...]
    min_gpus: int = 1
    telemetry: bool = False
    timeout_s: float = 900.0
    prepare: Callable[[Step, list[dict], Callable[[Step], dict]], Step] | None = field(
        default=None, compare=False, repr=False)

    def with_args(self, args: Sequence[str], **changes: Any) -> Step:
        return replace(self, args=tuple(args), **changes)


def replace_option(args: Sequence[str], flag: str, value: str) -> tuple[str, ...]:
    """A command line with the value of `flag` replaced (the flag must be there)."""
    out = list(args)
    out[out.index(flag) + 1] = value
    return tuple(out)


class Probe:
    """The protocol, with the defaults a probe that has nothing to say for a part takes.

    Class attributes:
      name          the command and the result document's kind
      summary       one line for the group's help ("collective bus bandwidth (NCCL), checked")
      help          the command's --help text
      payload       the document field holding the measurements (a document without it is refused)
      outputs       the file options the runner adds: json, csv, report
      output_help   the help of those options, where the probe words them itself
      stores        --db / --no-store / --prometheus and a history row
      gates         compare with the kind's baseline after storing; a regression is exit 1
      progress      how progress shows on a terminal: "bar", "status" (a spinner) or "lines"
      progress_default  None: on (a terminal gets `progress`, a log or pipe plain lines); True/False: always/never unless told
      own_telemetry the probe samples and judges clocks itself (the suite does not judge them again)
      per_node_prometheus  each node writes --prometheus itself (ctx.prometheus); the runner does not
      cpu           runs without a GPU, on CPU processes (gloo): True, or the condition ("under torchrun")
    """

    name: str = ""
    summary: str = ""
    help: str = ""
    payload: str = "measurements"
    outputs: tuple[str, ...] = ("json", "report")
    output_help: ClassVar[Mapping[str, str]] = {}
    stores: bool = True
    gates: bool = False
    progress: str = "status"
    progress_default: bool | None = None
    own_telemetry: bool = False
    per_node_prometheus: bool = False  # each node writes its own --prometheus textfile (fleet)
    cpu: bool | str = False

    # -- the command ---------------------------------------------------------------------------

    def options(self) -> list:
        """The probe's own click parameters (the runner adds outputs, storage and progress)."""
        return []

    def configure(self, opts: dict[str, Any]) -> Any:
        """Options -> a frozen config; InputError (exit code 2) for anything a user can get
        wrong, before any measurement."""
        raise NotImplementedError

    def default_report_dir(self, config: Any) -> str | None:
        """The report folder when --report is not given (None: no report)."""
        return None

    def tolerance(self, config: Any) -> float:
        """The smallest change that counts against the baseline, for a probe that gates."""
        return 0.05

    def gpus(self, config: Any) -> tuple[int, ...]:
        """The CUDA devices the run uses (whose other users the runner looks for)."""
        gpus = getattr(config, "gpus", None)
        return tuple(gpus) if isinstance(gpus, (tuple, list)) else ()

    def delegate(self, config: Any) -> int | None:
        """When the probe hands the command to other processes (comm --launch processes): their
        exit code; None to run here."""
        return None

    def run(self, config: Any, ctx: Context) -> Mapping:
        """Measures; returns the result document (a document.Document, raw samples inside).
        Faults (out of memory, NCCL errors, timeouts, Ctrl-C, SIGTERM) end the run with
        status.stopped set and what was measured kept; they are not raised."""
        raise NotImplementedError

    # -- reading a document ----------------------------------------------------------------------

    def schema(self) -> Any:
        """The declared shape of this probe's result document (a mgpu_bench.results.schema spec checked on
        every read, besides the envelope): SCHEMA in the probe's shape module (`<probe>.shape`,
        which imports no backend: the history validates through it); None: none."""
        return self.role("shape", "SCHEMA")

    def load(self, doc: Mapping) -> Any:
        """The probe's run object for `doc`: the one it measured, or rebuilt from the JSON."""
        run = getattr(doc, "run", None)
        return run if run is not None else self.from_document(doc)

    def from_document(self, doc: Mapping) -> Any:
        """The run rebuilt from its JSON: the probe's `document.run_from_document(doc)` where it
        has one, else the document itself."""
        build = self.role("document", "run_from_document")
        return build(dict(doc)) if build is not None else doc

    def records(self, doc: Mapping) -> list[Mapping]:
        """The documents the history keeps for this run: the run itself, and for a probe that
        measures many nodes one per node under its own host."""
        return [doc]

    def measured(self, doc: Mapping) -> bool:
        """Anything to store and draw."""
        return bool(doc.get(self.payload))

    def failure(self, doc: Mapping) -> str | None:
        """A measurement that went wrong though the run completed (wrong elements, a failed
        configuration): one line, and exit code 1. By convention `analyse.failure(run)`."""
        return self.call_role("analyse", "failure", doc, default=None)

    def findings(self, doc: Mapping) -> list[Finding]:
        """What the command prints on top, each with its severity: `analyse.findings(run)`."""
        return self.call_role("analyse", "findings", doc, default=[])

    def finding_label(self, finding: Finding) -> str:
        """How the command labels a finding on the terminal."""
        return "finding"

    def judge(self, doc: Mapping) -> list[Finding]:
        """What the suite adds to the findings: figures against theory and what they should
        be, the healthy ones as ok: `analyse.judge(run)`."""
        return self.call_role("analyse", "judge", doc, default=[])

    def verdict(self, doc: Mapping) -> Verdict | None:
        return None

    def estimate(self, config) -> str | None:
        """The run's expected length from its plan, said when it starts ("about 2 min: ..."), or
        None where the plan does not tell."""
        return None

    def notes(self, doc: Mapping) -> list[str]:
        return [str(n) for n in doc.get("notes") or []]

    def headline(self, doc: Mapping) -> list:
        """The metrics.Metric list history and compare use: `headline.headline(doc)` (it reads
        the document, never a backend)."""
        build = self.role("headline", "headline")
        return build(doc) if build is not None else []

    def key_figure(self, doc: Mapping) -> tuple[str, str]:
        """(the figure, what it is judged against) for the suite's table: `analyse.key_figure(run)`."""
        return self.call_role("analyse", "key_figure", doc, default=("-", "-"))

    # -- drawing ---------------------------------------------------------------------------------

    def render(self, doc: Mapping, console) -> None:
        """Tables and the closing line on the terminal (rich console): `render.render_terminal(run,
        console)`."""
        self.call_role("render", "render_terminal", doc, console, default=None)

    def csv(self, doc: Mapping) -> str:
        """One row per measurement, base units: `render.render_csv(run)` (a probe in whose outputs
        "csv" is has one)."""
        if self.role("render", "render_csv") is None:
            raise NotImplementedError(f"{self.name} writes no CSV")
        return self.call_role("render", "render_csv", doc)

    def images(self, doc: Mapping) -> dict[str, bytes]:
        """PNGs keyed by file stem, for the suite page: `report.images(run)`."""
        return self.call_role("report", "images", doc, default={})

    def section(self, doc: Mapping, images: Mapping[str, bytes]) -> str:
        """The probe's part of the suite page (HTML), given its images: `report.section(run, images)`."""
        return self.call_role("report", "section", doc, dict(images), default="")

    def report(self, doc: Mapping, out_dir: str | Path, history=None) -> list[Path]:
        """The probe's own report folder: PNGs, report.html, summary.md, from
        `report.write_report(run, out_dir)`. `history`: the open history.History the run was stored
        in, or None."""
        if self.role("report", "write_report") is None:
            raise NotImplementedError(f"{self.name} writes no report")
        return self.call_role("report", "write_report", doc, out_dir, history=history)

    # -- the roles, found by convention ------------------------------------------------------------

    def role(self, module: str, function: str) -> Callable | None:
        """The probe's own `<its package>.<module>.<function>` (analyse.findings, report.section,
        ...), or None where the probe has no such module or function. Imported when first asked
        for, so the CLI and the history never load a probe's backend to build a command or read a
        headline."""
        package = REGISTRY.get(self.name)
        if package is None:
            return None
        name = f"{package}.{module}"
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module is there, something it imports is not
                raise
            return None
        return getattr(mod, function, None)

    def call_role(self, module: str, function: str, doc: Mapping, *args: Any, default: Any = _NO_DEFAULT,
                  **named: Any) -> Any:
        """Calls the role `module.function` with the run (load(doc)) and `args`, and by keyword
        whichever of these the function's signature names: doc (the document), environment (its
        fingerprint), shared (the other processes found on the GPUs, occupancy.Shared), plus
        `named` (history for write_report). `default` where the probe has no such role."""
        fn = self.role(module, function)
        if fn is None:
            if default is _NO_DEFAULT:
                raise NotImplementedError(f"{self.name} has no {module}.{function}")
            return default
        wanted = _parameters(fn)
        extras: dict[str, Any] = {}
        if "doc" in wanted:
            extras["doc"] = doc
        if "environment" in wanted:
            extras["environment"] = doc.get("environment") or {}
        if "shared" in wanted:
            from mgpu_bench.machine.occupancy import from_document

            extras["shared"] = from_document(doc)
        extras.update({k: v for k, v in named.items() if k in wanted})
        return fn(self.load(doc), *args, **extras)

    # -- the suite -------------------------------------------------------------------------------

    def suite_steps(self, plan: PlanContext) -> list[Step]:
        return []


@dataclass
class Context:
    """What the runner hands a probe's run: the environment fingerprint taken before it, the
    command line, this process's rank under a launcher (0 otherwise), the progress display
    (say(text), step(i, total, text)) and the watch on the GPUs' other users
    (occupancy.Watch: check() -> the foreign processes)."""

    environment: dict
    command: list[str]
    rank: int
    progress: Any
    occupancy: Any = None
    prometheus: str | None = None  # for a per_node_prometheus probe: where each node writes its text
    history: Any = None  # opens the history database the run is stored in (read a baseline before judging)


def option(*decls: str, **attrs: Any):
    """A click option declared as @click.option would declare it, its numbers (and the numbers in
    its text) written with ASCII digits only (numbers.ascii_type)."""
    import click

    from .numbers import ascii_type

    if not any("/" in d for d in decls):  # a --x/--no-x pair is a flag
        attrs["type"] = ascii_type(attrs.get("type"), attrs.get("default"), attrs.get("is_flag", False))
    return click.Option(list(decls), **attrs)


def within(flag: str, value: float, low: float, high: float, why: str = "", *, above: bool = False) -> None:
    """A bounded option checked in configure(): InputError (exit code 2) naming the bound the
    value broke, "--steps 999999999: at most 1000000 (why)", "--steps 0: at least 1";
    low <= value <= high, or low < value <= high with `above`. NaN and infinities break both."""
    import math

    from mgpu_bench.core.errors import InputError

    def show(x: float) -> str:  # the value and its bounds alike, exactly: 60000.0000001 is not "60000"
        if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
            return str(int(x))
        return repr(x) if isinstance(x, float) else str(x)  # the shortest text that reads back as x

    tail = f" ({why})" if why else ""
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{flag} {value}: give a number {'above' if above else 'from'} {show(low)} "
                         f"{'up ' if above else ''}to {show(high)}{tail}")
    if value > high:
        raise InputError(f"{flag} {show(value)}: at most {show(high)}{tail}")
    if value < low or (above and value == low):
        raise InputError(f"{flag} {show(value)}: {'more than' if above else 'at least'} {show(low)}{tail}")


@functools.cache
def _parameters(fn: Callable) -> frozenset[str]:
    """The names a role function takes by keyword (its parameters after the run)."""
    return frozenset(list(inspect.signature(fn).parameters)[1:])


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> Probe:
    """The registered probe; KeyError for a name that is none."""
    return importlib.import_module(REGISTRY[name]).PROBE


def for_document(doc: Mapping) -> Probe | None:
    """The probe whose document this is (by its kind), or None."""
    from .document import document_kind

    kind = document_kind(doc)
    return get(kind) if kind in REGISTRY else None


def headline(doc: Mapping) -> list:
    """The headline metrics of any result document ([] for a kind no probe knows); non-finite
    values left out."""
    import math

    probe = for_document(doc)
    if probe is None:
        return []
    return [m for m in probe.headline(doc) if math.isfinite(m.value)]


# -- reading a result document of any kind -------------------------------------------------------


def kind_schema(kind: str):
    """The declared shape (schema.Spec) of `kind`'s own fields (None: the envelope alone)."""
    return get(kind).schema()


def check_document(doc: Mapping, path: str = "") -> None:
    """The envelope and the kind's declared shape; schema._Problem at the first wrong field."""
    from .document import RESULT_SCHEMA, RESULT_SCHEMA_VERSION, document_kind
    from .schema import ENVELOPE, _join, _Problem, _show

    where = _join(path, "schema")
    if doc.get("schema") != RESULT_SCHEMA:
        tag = f"is {_show(doc['schema'])}" if "schema" in doc else "missing"
        raise _Problem(where, f"{tag}: this is not an mgpu-bench result document (one says \"schema\": "
                              f"\"{RESULT_SCHEMA}\"); give a file written by a command's --json")
    if "schema_version" not in doc:
        raise _Problem(_join(path, "schema_version"), "missing (a result document carries its schema version)")
    for key, spec in ENVELOPE.items():
        if key in doc:
            spec.check(doc[key], _join(path, key))
    if doc["schema_version"] > RESULT_SCHEMA_VERSION:
        raise _Problem(_join(path, "schema_version"),
                       f"is {doc['schema_version']}: written by a newer mgpu-bench (this one reads "
                       f"{RESULT_SCHEMA_VERSION}); upgrade mgpu-bench")
    kind = document_kind(doc)
    kinds = names()
    if kind not in kinds:
        if "kind" in doc:
            raise _Problem(_join(path, "kind"), f"is {_show(doc['kind'])}, not a kind of result ({', '.join(kinds)})")
        raise _Problem(_join(path, "kind"), f"missing, and the fields do not say the kind ({', '.join(kinds)})")
    spec = kind_schema(kind)
    if spec is not None:
        spec.check(doc, path)


def validate(doc: Any, where: str | None = None) -> Mapping:
    """Checks a result document against the envelope (schema.ENVELOPE) and its kind's declared
    shape (Probe.schema); returns it. schema.SchemaError (exit code 2) names `where` (the file,
    "stored run r3"), the field and the fix."""
    from .schema import SchemaError, _Problem, _show

    if not isinstance(doc, Mapping):
        raise SchemaError(where, "", f"is {_show(doc)}, not a result document (an object written by a command's "
                                     "--json)")
    try:
        check_document(doc)
    except _Problem as p:
        raise SchemaError(where, p.path, p.problem) from None
    except RecursionError:
        raise SchemaError(where, "", "is nested too deeply to be a result document") from None
    return doc


def load_document(path: str | Path, where: str | None = None) -> dict:
    """Reads a result document from a file and checks it against its declared shape
    (validate): InputError (exit code 2), one line naming the file, for a file
    that cannot be read, is not JSON, or is not a result document of a known kind and shape."""
    import json
    import os
    import stat

    from mgpu_bench.core.errors import InputError

    from .schema import shown

    name = where or shown(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode) and not stat.S_ISDIR(os.stat(path).st_mode):
            raise InputError(f"{name} is not a regular file (a FIFO or a device would be read without end): give "
                             "a result file written by a command's --json")
        text = Path(path).read_bytes().decode("utf-8")
    except IsADirectoryError:
        raise InputError(f"{name} is a folder: give a result file written by a command's --json") from None
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{name} is not text (UTF-8 JSON): give a file written by a command's --json") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise InputError(f"{name} is nested too deeply to be a result document") from None
    except ValueError as exc:
        raise InputError(f"{name} is not JSON ({exc}): give a file written by a command's --json") from None
    validate(doc, name)
    return doc

"""`comm --tune`, the rule that recommends (pure Python, no GPU): at every size of a band a setting
must beat the default by more than max(MIN_GAIN, NOISE_FACTOR x noise); a setting that failed
its data check, or uses NVLS where NVLS is off, is never recommended; one that costs elsewhere
is given for its band only; settings recommended together are measured together once more
(Advice). Tuning is the whole run, as the comm document holds it (its choices derived again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from mgpu_bench.results.measurement import CommMeasurement

from .trials import COMBINED, DEFAULT, Band, Candidate, Nvls, Trial

MIN_GAIN = 0.02  # a setting must beat the default by more than this (2%) ...
NOISE_FACTOR = 3.0  # ... and by more than this many times the noise


# -- the decision (pure) --------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """A setting against the default at one size: gain = busbw / default busbw - 1 (the
    better default run), noise (relative; None: too few samples) and the gain needed."""

    size: int
    default_busbw: float
    busbw: float
    gain: float
    noise: float | None

    @property
    def needed(self) -> float | None:
        return None if self.noise is None else max(MIN_GAIN, NOISE_FACTOR * self.noise)

    @property
    def passes(self) -> bool:
        return self.needed is not None and self.gain > self.needed

    @property
    def margin(self) -> float:
        return float("-inf") if self.needed is None else self.gain - self.needed

    @property
    def loses(self) -> bool:
        """Slower than the default beyond the same threshold (2% where there is no noise figure)."""
        return self.gain < -(self.needed if self.needed is not None else MIN_GAIN)


def compare(defaults: Sequence[CommMeasurement], m: CommMeasurement) -> Comparison:
    """`m` against the default runs at its size (see the module's rule)."""
    base = max(d.busbw for d in defaults)
    covs = [d.cov for d in defaults] + [m.cov]
    noise = None
    if all(c is not None for c in covs):
        spread = (base - min(d.busbw for d in defaults)) / base if base > 0 else 0.0
        noise = max([float(c) for c in covs] + [spread])
    gain = m.busbw / base - 1 if base > 0 else float("nan")
    return Comparison(m.spec.size, base, m.busbw, gain, noise)


def exclusion(trial: Trial, nvls: Nvls) -> str | None:
    """Why a setting is never recommended (anywhere), or None."""
    from mgpu_bench.results.sizes import format_bytes

    if trial.wrong:
        bad = next(m for m in trial.measurements if m.total_wrong)
        return (f"failed the data check: {trial.wrong} wrong element(s) ({bad.spec.op} {format_bytes(bad.spec.size)} "
                "first)")
    if trial.error:
        return f"failed: {trial.error}"
    if trial.candidate.uses_nvls and not nvls.allowed:
        return f"NVLS is off here: {nvls.why}"
    return None


@dataclass(frozen=True)
class Choice:
    """The best setting for one collective in one band, and whether it is recommended.
    The figures are those of `at`, the band's size where the setting's margin over the needed
    gain is smallest (the size that decides); costs: where it loses elsewhere."""

    op: str
    band: Band
    setting: str | None
    recommended: bool
    reason: str
    at: Comparison | None = None
    costs: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        c = self.at
        return {"op": self.op, "band": self.band.name, "sizes": list(self.band.sizes), "setting": self.setting,
                "recommended": self.recommended, "reason": self.reason, "costs": list(self.costs),
                "at_bytes": c.size if c else None, "default_busbw": c.default_busbw if c else None,
                "busbw": c.busbw if c else None, "gain": c.gain if c else None, "noise": c.noise if c else None,
                "needed": c.needed if c else None}


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def defaults_at(trials: Sequence[Trial], op: str, size: int) -> list[CommMeasurement]:
    """The default runs' measurements of `op` at `size` (one or two)."""
    return [m for t in trials if t.candidate.group == DEFAULT for m in [t.at(op, size)] if m is not None]


def _scored(trials: Sequence[Trial], op: str, band: Band) -> list[tuple[float, Trial, list[Comparison]]]:
    """(worst-size gain, trial, comparisons) of every single setting measured at every size of
    the band (the default measured there too)."""
    out = []
    for t in trials:
        if t.candidate.group in (DEFAULT, COMBINED) or op not in t.candidate.ops:
            continue
        ms = [t.at(op, s) for s in band.sizes]
        if all(m is not None for m in ms):
            comps = [compare(defaults_at(trials, op, s), m) for s, m in zip(band.sizes, ms)]
            out.append((min(c.gain for c in comps), t, comps))
    return out


def _choice(trials: Sequence[Trial], scored: tuple[float, Trial, list[Comparison]], op: str, band: Band,
            bands: Sequence[Band], ops: Sequence[str]) -> Choice:
    """One setting in one band judged by the rule, with the reason and, if it passes, its costs."""
    from mgpu_bench.results.sizes import format_bytes

    score, t, comps = scored
    worst = min(comps, key=lambda c: c.margin)
    passes = all(c.passes for c in comps)
    size = format_bytes(worst.size)
    if passes:
        reason = (f"{_pct(worst.gain)} at {size} beats the {100 * worst.needed:.1f}% needed (max(2%, 3 x noise)), "
                  "and so does every size of the band")
    elif worst.noise is None:
        reason = f"no noise figure at {size} (fewer than 5 samples): raise --min-time"
    elif score <= 0:
        reason = f"no other setting beat the default: the best gives {_pct(worst.gain)} at {size}"
    else:
        reason = (f"{_pct(worst.gain)} at {size} is within the {100 * worst.needed:.1f}% needed: "
                  f"max(2%, 3 x noise {100 * worst.noise:.1f}%)")
    costs = tuple(_costs(trials, t, op, band, bands, ops)) if passes else ()
    return Choice(op, band, t.candidate.label, passes, reason, worst, costs)


def evaluate(trials: Sequence[Trial], bands: Sequence[Band], ops: Sequence[str], nvls: Nvls) -> list[Choice]:
    """Every setting that may be recommended, judged by the rule in every band it ran in."""
    return [_choice(trials, sc, op, band, bands, ops) for op in ops for band in bands
            if all(defaults_at(trials, op, s) for s in band.sizes)
            for sc in _scored(trials, op, band) if exclusion(sc[1], nvls) is None]


def decide(trials: Sequence[Trial], bands: Sequence[Band], ops: Sequence[str], nvls: Nvls) -> list[Choice]:
    """Per collective and band: the setting with the best worst-size gain among those that may
    be recommended (on a tie, one that costs nothing elsewhere), and whether it passes the rule
    at every size of the band."""
    out = []
    for op in ops:
        for band in bands:
            if not all(defaults_at(trials, op, s) for s in band.sizes):
                out.append(Choice(op, band, None, False, "the default was not measured at every size of the band"))
                continue
            scored = _scored(trials, op, band)
            eligible = [sc for sc in scored if exclusion(sc[1], nvls) is None]
            if not eligible:
                why = "no other setting ran at every size of the band" if not scored else \
                    "every other setting failed or is off here"
                out.append(Choice(op, band, None, False, why))
                continue
            judged = [(sc[0], _choice(trials, sc, op, band, bands, ops)) for sc in eligible]
            score, best = max(judged, key=lambda j: (j[0], not j[1].costs))
            off = [sc for sc in scored if sc[0] > score and exclusion(sc[1], nvls)]
            if off:
                top = max(off, key=lambda sc: sc[0])
                best = replace(best, reason=f"{best.reason}; {top[1].candidate.label} did better but "
                                            f"{exclusion(top[1], nvls)}")
            out.append(best)
    return out


def _costs(trials: Sequence[Trial], trial: Trial, op: str, band: Band, bands: Sequence[Band],
           ops: Sequence[str]) -> list[str]:
    """Where `trial` loses against the default outside (op, band): "-8.1% at 256 MiB"."""
    from mgpu_bench.results.sizes import format_bytes

    out = []
    for op2 in ops:
        for b in bands:
            if (op2, b) == (op, band):
                continue
            for s in b.sizes:
                m, base = trial.at(op2, s), defaults_at(trials, op2, s)
                if m is not None and base:
                    c = compare(base, m)
                    if c.loses:
                        out.append(f"{_pct(c.gain)} at {format_bytes(s)}" + ("" if op2 == op else f" ({op2})"))
    return out


@dataclass(frozen=True)
class Advice:
    """What to paste: `lines` (for every job) and `given` (per setting in them, where it gained:
    "NCCL_PROTO=allreduce:LL128: allreduce 1 MiB-4 MiB (+7.1%)"), `only_for` ((lines, where it
    gains, what it costs elsewhere) for jobs whose messages are all in those bands), notes, and
    `combined`: the candidate to measure before several settings are given together (None when
    nothing is left to measure)."""

    lines: tuple[str, ...]
    only_for: tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...]
    notes: tuple[str, ...]
    combined: Candidate | None = None
    given: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"lines": list(self.lines), "given": list(self.given), "notes": list(self.notes),
                "only_for": [{"lines": list(lines), "where": where, "costs": list(costs)}
                             for lines, where, costs in self.only_for]}


def advise(choices: Sequence[Choice], trials: Sequence[Trial]) -> Advice:
    """The lines to paste from the recommended choices (evaluate(): every setting that passes
    in a band, not only each band's best): settings that lose nowhere, one value per variable
    (the larger gain wins); two or more only once measured together and found to hold in every
    band where each was recommended (else the best alone). Those that cost elsewhere are given
    for their bands only."""
    recs = [c for c in choices if c.recommended]
    by_label: dict[str, list[Choice]] = {}
    for c in recs:
        by_label.setdefault(str(c.setting), []).append(c)
    cand = {t.candidate.label: t.candidate for t in trials}
    gain = {lab: max(c.at.gain for c in cs if c.at) for lab, cs in by_label.items()}
    where = {lab: ", ".join(f"{c.op} {c.band.label} ({_pct(c.at.gain)})" for c in cs if c.at)
             for lab, cs in by_label.items()}
    costs = {lab: tuple(dict.fromkeys(x for c in cs for x in c.costs)) for lab, cs in by_label.items()}
    only_for = tuple((tuple(cand[lab].lines()), where[lab], costs[lab]) for lab in by_label if costs[lab])
    chosen: list[str] = []
    notes: list[str] = []
    for lab in sorted((lab for lab in by_label if not costs[lab]), key=lambda lab: -gain[lab]):
        names = {k for k, _ in cand[lab].env}
        clash = next((c for c in chosen if names & {k for k, _ in cand[c].env}), None)
        if clash:
            notes.append(f"{lab} also beat the default: {where[lab]}, but sets what {clash} sets, which gained more")
        else:
            chosen.append(lab)
    if len(chosen) < 2:
        return Advice(tuple(x for lab in chosen for x in cand[lab].lines()), only_for, tuple(notes),
                      given=tuple(f"{lab}: {where[lab]}" for lab in chosen))
    together = Candidate(tuple(kv for lab in chosen for kv in cand[lab].env), COMBINED,
                         tuple(dict.fromkeys(op for lab in chosen for op in cand[lab].ops)))
    trial = next((t for t in trials if t.candidate.label == together.label), None)
    best = chosen[0]
    if trial is None:
        notes.append(f"{', '.join(chosen[1:])} also beat the default alone; not measured together with {best}, so "
                     "only the best is given")
        return Advice(tuple(cand[best].lines()), only_for, tuple(notes), together, (f"{best}: {where[best]}",))
    holds, figures = _holds(trial, [c for lab in chosen for c in by_label[lab]], trials)
    if holds:
        notes.append(f"measured together: {figures}")
        return Advice(tuple(together.lines()), only_for, tuple(notes),
                      given=tuple(f"{lab}: {where[lab]}" for lab in chosen))
    notes.append(f"together they did not hold ({figures}): only the best alone, {best}, is given")
    return Advice(tuple(cand[best].lines()), only_for, tuple(notes), given=(f"{best}: {where[best]}",))


def _holds(trial: Trial, recs: Sequence[Choice], trials: Sequence[Trial]) -> tuple[bool, str]:
    """Whether the settings measured together pass the rule wherever one of them was
    recommended and lose nowhere; with the figures that say so."""
    from mgpu_bench.results.sizes import format_bytes

    if exclusion(trial, Nvls(True, "")):
        return False, str(exclusion(trial, Nvls(True, "")))
    figures, ok = [], True
    for c in recs:
        for s in c.band.sizes:
            m, base = trial.at(c.op, s), defaults_at(trials, c.op, s)
            if m is None or not base:
                return False, f"not measured at {c.op} {format_bytes(s)}"
            comp = compare(base, m)
            ok &= comp.passes
            figures.append((c.op, s, f"{_pct(comp.gain)} at {format_bytes(s)}"))
    for m in trial.measurements:
        base = defaults_at(trials, m.spec.op, m.spec.size)
        if base and compare(base, m).loses:
            ok = False
            figures.append((m.spec.op, m.spec.size, f"{_pct(compare(base, m).gain)} at {format_bytes(m.spec.size)}"))
    named = len({op for op, _, _ in figures}) > 1
    return ok, ", ".join(dict.fromkeys(text + (f" ({op})" if named else "") for op, _, text in sorted(figures)))


# -- the whole tuning run ---------------------------------------------------------------------------


@dataclass
class Tuning:
    """A tuning run: its bands, the collectives, NCCL's version, NVLS, every trial in run order."""

    ops: tuple[str, ...]
    bands: tuple[Band, ...]
    nccl_version: int
    nvls: Nvls
    trials: list[Trial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def choices(self) -> list[Choice]:
        return decide(self.trials, self.bands, self.ops, self.nvls)

    def advice(self) -> Advice:
        return advise(evaluate(self.trials, self.bands, self.ops, self.nvls), self.trials)

    @property
    def wrong(self) -> list[Trial]:
        return [t for t in self.trials if t.wrong]

    def to_dict(self) -> dict:
        choices = self.choices()
        return {"ops": list(self.ops), "bands": [{"name": b.name, "sizes": list(b.sizes)} for b in self.bands],
                "nccl_version": self.nccl_version, "nvls": {"allowed": self.nvls.allowed, "why": self.nvls.why},
                "rule": {"min_gain": MIN_GAIN, "noise_factor": NOISE_FACTOR}, "notes": list(self.notes),
                "trials": [t.to_dict() for t in self.trials],
                "choices": [c.to_dict() for c in choices], "advice": self.advice().to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping) -> Tuning:
        """The run from its document ("choices" and "advice" are derived again, never read)."""
        nv = d.get("nvls") or {}
        return cls(tuple(d["ops"]), tuple(Band(b["name"], tuple(b["sizes"])) for b in d["bands"]),
                   int(d.get("nccl_version") or 0), Nvls(bool(nv.get("allowed")), str(nv.get("why", ""))),
                   [Trial.from_dict(t) for t in d.get("trials") or []], list(d.get("notes") or []))

"""What `mgpu-bench plan` is asked: the workload, the budget (tokens or samples), days or GPUs, and
how it trains. Plain data and the parsers of its options (bad input is InputError: exit code 2)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from mgpu_bench.core.errors import InputError

from .layout import Layout

MAX_COUNT = 1e18  # a token or sample budget beyond this is a typo (the largest published budgets are ~1e13)
MAX_DAYS = 36_500.0
MAX_GPUS = 1_000_000
MAX_LAYERS = 10_000  # a bare size's bounds: far above any published model, and answered at once
MAX_WIDTH = 1 << 20
MAX_VOCAB = 10_000_000
MAX_PARAMS = 1e15  # a bare size beyond is a typo (the plan's figures would stop meaning anything)
MAX_RATE = 1e18  # FLOP/s per GPU: --rate beyond is a typo (one B200 is 2.25e15 dense bf16)
MIN_MFU = 0.01  # --mfu below is a typo for a percentage or a broken job (published large runs reach 0.3-0.6)
COUNT_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}  # decimal: 300B = 3e11 tokens
_COUNT = re.compile(r"^\s*((?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([kmbgt]?)\s*(?:tokens?|samples?)?\s*$",
                    re.IGNORECASE)
# A bare GPT size: layers=L,width=D[,heads=H][,vocab=V]; its parameters come from the GPT formula.
BARE_KEYS = ("layers", "width", "heads", "vocab")


@dataclass(frozen=True)
class BareSize:
    """A GPT shape given by its sizes, not built: the built-in GPT's layout (pre-LayerNorm blocks,
    an MLP 4x wide, learned positions, the LM head tied to the token table) at these sizes."""

    layers: int
    width: int
    heads: int
    vocab: int = 50304

    @property
    def key(self) -> str:
        return f"gpt-L{self.layers}-d{self.width}"

    @property
    def params_about(self) -> float:
        """12 L d^2 + V d: the GPT formula's leading terms, to bound a size before anything uses it."""
        return 12.0 * self.layers * self.width ** 2 + float(self.vocab) * self.width


@dataclass(frozen=True)
class PlanConfig:
    """model: what --model said (a workload form, or a bare size); tokens / samples: the budget
    (one of them); days xor gpus: the question (neither: the curve alone); parallel: --parallel as
    given, layout and search: what it says (layout.py), checkpointing: activation recomputation;
    seq_len / image_size / batch_size None: the workload's defaults (batch_size is the micro-batch
    where tp or pp > 1); global_batch: samples per optimizer step over all GPUs (None: one
    micro-batch per GPU under data parallelism, 8 x pp micro-batches per step with a pipeline);
    network: a hardware.json network for the traffic between nodes; gpus_per_node None: read from
    the history; gpu: the hardware.json key of the GPU to plan for (None: this machine's, else the
    stored runs'); rate: an achieved FLOP/s per GPU over the whole step, mfu: an assumed model
    FLOPs utilisation (either replaces the measured step); measure: run what is missing first; db:
    the history database (None: the default); noise_scale: --noise-scale as given (a stored run, or
    a number of samples), noise_batch: B_0 in samples (estimate/goodput.py)."""

    model: str
    tokens: float | None = None
    samples: float | None = None
    days: float | None = None
    gpus: int | None = None
    parallel: str = "ddp"
    layout: Layout = field(default_factory=Layout)
    search: bool = False
    checkpointing: bool = False
    global_batch: int | None = None
    seq_len: int | None = None
    image_size: int | None = None
    batch_size: int | None = None
    network: str | None = None
    gpus_per_node: int | None = None
    gpu: str | None = None
    rate: float | None = None
    mfu: float | None = None
    measure: bool = False
    db: str | None = None
    noise_scale: str | None = None
    noise_batch: float | None = None

    @property
    def budget(self) -> float:
        return self.tokens if self.tokens is not None else float(self.samples or 0.0)

    @property
    def budget_unit(self) -> str:
        return "tokens" if self.tokens is not None else "samples"


def parse_count(text: str, flag: str) -> float:
    """'300B' -> 3e11, '1.2T' -> 1.2e12, '5e11' -> 5e11 (K, M, B or G, T: 10^3, 10^6, 10^9, 10^12,
    case-insensitive; a trailing 'tokens' or 'samples' is allowed); InputError otherwise."""
    m = _COUNT.match(text or "")
    if not m:
        raise InputError(f"{flag} {text!r}: write a count like 300B, 1.2T or 5e11 (K, M, B, T: thousand, million, "
                         "billion, trillion)")
    value = float(m.group(1)) * COUNT_UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value < 1:
        raise InputError(f"{flag} {text!r}: give at least 1")
    if value > MAX_COUNT:
        raise InputError(f"{flag} {text!r}: at most 1e18; check the unit")
    return value


_RATE = re.compile(r"^\s*((?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([kmgtp]?)\s*(?:flop/?s|flops)?\s*$", re.IGNORECASE)
RATE_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_rate(text: str) -> float:
    """'140T' -> 1.4e14 FLOP/s ('140 TFLOP/s', '1.4e14' too); InputError otherwise."""
    m = _RATE.match(text or "")
    if not m:
        raise InputError(f"--rate {text!r}: write FLOP/s per GPU like 140T, 140 TFLOP/s or 1.4e14 (K M G T P)")
    value = float(m.group(1)) * RATE_UNITS[m.group(2).lower()]
    if not math.isfinite(value) or not 1e9 <= value <= MAX_RATE:
        raise InputError(f"--rate {text!r}: give 1 GFLOP/s to 1e18 FLOP/s per GPU (140T is 140 TFLOP/s)")
    return value


def parse_bare_size(text: str) -> BareSize | None:
    """`layers=48,width=6144[,heads=48][,vocab=50304]` -> BareSize; None for any other --model
    form (they have no '='). heads defaults to width / 64 (GPT-2's 64-wide heads), or the nearest
    count below that divides the width: it enters the attention term of the activation formula
    and what tensor parallelism may split."""
    if "=" not in text:
        return None
    values: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in BARE_KEYS:
            raise InputError(f"--model {text!r}: a bare size is layers=L,width=D[,heads=H][,vocab=V]; "
                             f"{part.strip()!r} is not one of its parts")
        if key in values:
            raise InputError(f"--model {text!r}: {key} is given twice")
        try:
            values[key] = int(value.strip())
        except ValueError:
            raise InputError(f"--model {text!r}: {key}={value.strip()!r} is not a whole number") from None
        top = {"layers": MAX_LAYERS, "width": MAX_WIDTH, "heads": MAX_WIDTH, "vocab": MAX_VOCAB}[key]
        if not 1 <= values[key] <= top:
            raise InputError(f"--model {text!r}: {key} must be from 1 to {top}")
    for key in ("layers", "width"):
        if key not in values:
            raise InputError(f"--model {text!r}: a bare size needs layers and width (layers=48,width=6144)")
    width = values["width"]
    heads = values.get("heads") or next(h for h in range(max(1, width // 64), 0, -1) if not width % h)
    if width % heads:
        raise InputError(f"--model {text!r}: width {width} is not a multiple of heads {heads}")
    size = BareSize(values["layers"], width, heads, values.get("vocab", 50304))
    if size.params_about > MAX_PARAMS:
        raise InputError(f"--model {text!r}: about {size.params_about:.3g} parameters; at most {MAX_PARAMS:.0e} "
                         "(check layers and width)")
    return size

"""How a plan trains: the tensor (tp, within a node), pipeline (pp) and data-parallel (dp) degrees,
the model states replicated (DDP) or partitioned over the data-parallel ranks by a ZeRO stage
(Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
SC20, section 5), sequence parallelism wherever tp > 1, and activation recomputation or not; the
parser of --parallel.

    ddp, zero1, zero2, fsdp         data parallelism alone (tp = pp = 1): DDP replicates the model
                                    states; ZeRO-1 (P_os) partitions the optimizer states, ZeRO-2
                                    (P_os+g) the gradients too (DeepSpeed's stages 1 and 2); FSDP is
                                    ZeRO-3 (P_os+g+p), the parameters too, as the model probe trains
    tp=T[,pp=P][,dp=D][,SHARD]      Megatron-LM's layout (Narayanan et al. 2021, SC21): tp GPUs of
                                    one node split every layer, pp stages split the layers, dp
                                    replicas of that split; tp x pp x dp = the GPUs
    search                          the plan tries tp, pp, the four shardings and recomputation itself

Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4.2.2) goes with every tp > 1: its all-gathers and reduce-scatters
move the bytes of tensor parallelism's all-reduces and split the activations outside the matmuls
by tp as well."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from mgpu_bench.core.errors import InputError

SHARDS = ("ddp", "zero1", "zero2", "fsdp")
ZERO_STAGES = ("zero1", "zero2")  # DeepSpeed's stages 1 and 2; ZeRO-3 is planned as FSDP
# How each names itself in the plan's words (ZeRO's stages: Rajbhandari et al. 2020, section 5.1)
SHARD_WORDS = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "fsdp": "FSDP"}
SHARD_HELP = {"ddp": "DDP (every GPU holds all the model states)",
              "zero1": "ZeRO-1 (the optimizer states partitioned over the data-parallel ranks)",
              "zero2": "ZeRO-2 (the optimizer states and the gradients partitioned)",
              "fsdp": "FSDP, ZeRO-3 (the optimizer states, gradients and parameters partitioned)"}
MAX_DEGREE = 100_000
PARALLEL_HELP = ("ddp (default), zero1, zero2 (DeepSpeed's ZeRO stages 1 and 2: the optimizer states, and with 2 the "
                 "gradients, partitioned over the data-parallel ranks), fsdp (ZeRO-3: the parameters too), the "
                 "degrees tp=T,pp=P[,dp=D][,zero1|zero2|fsdp] (tensor parallelism within a node, pipeline stages, "
                 "data-parallel replicas: tp x pp x dp = the GPUs), or search (the plan tries tp, pp, the four "
                 "shardings and --checkpointing itself).")


@dataclass(frozen=True)
class Layout:
    """tp x pp GPUs hold one replica of the model; dp None: as many replicas as the GPUs make."""

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    shard: str = "ddp"
    checkpointing: bool = False

    @property
    def model_gpus(self) -> int:
        return self.tp * self.pp

    @property
    def plain(self) -> bool:
        """Data parallelism alone: what the model probe measures."""
        return self.tp == 1 and self.pp == 1

    @property
    def sp(self) -> bool:
        return self.tp > 1

    @property
    def sharded(self) -> bool:
        """The model states per GPU shrink with the data-parallel ranks (a ZeRO stage, FSDP)."""
        return self.shard != "ddp"

    @property
    def shard_words(self) -> str:
        return SHARD_WORDS[self.shard]

    @property
    def name(self) -> str:
        """The metric-name segment: ddp, fsdp, tp8-pp16-ddp, ddp-ckpt."""
        parts = [] if self.plain else [f"tp{self.tp}", f"pp{self.pp}"]
        return "-".join([*parts, self.shard, *(["ckpt"] if self.checkpointing else [])])

    def ranks(self, gpus: int) -> int | None:
        """The data-parallel ranks on `gpus` GPUs; None where tp x pp does not divide them."""
        if gpus < self.model_gpus or gpus % self.model_gpus:
            return None
        return gpus // self.model_gpus

    def words(self, gpus: int | None = None) -> str:
        """'tp=8, pp=16, dp=8 (DDP over the replicas, sequence parallel, recomputation)'."""
        d = self.ranks(gpus) if gpus else self.dp
        if self.plain:
            head = self.shard_words
        else:
            head = f"tp={self.tp}, pp={self.pp}" + (f", dp={d}" if d else "") + f", {self.shard_words} over the replicas"
        extras = (["sequence parallel"] if self.sp else []) + (["recomputation"] if self.checkpointing else [])
        return head + (f" ({', '.join(extras)})" if extras else "")

    def but(self, **changes) -> Layout:
        return replace(self, **changes)

    def to_dict(self, gpus: int | None = None) -> dict:
        return {"tp": self.tp, "pp": self.pp, "dp": self.ranks(gpus) if gpus else self.dp, "shard": self.shard,
                "sp": self.sp, "checkpointing": self.checkpointing, "name": self.name, "text": self.words(gpus)}


_DEGREE = re.compile(r"^(tp|pp|dp)\s*=\s*([0-9]+)$")


def parse(text: str, checkpointing: bool = False) -> tuple[Layout, bool]:
    """--parallel -> (the layout, whether to search); InputError (exit 2) naming the part that is
    wrong. `checkpointing`: --checkpointing (activation recomputation)."""
    parts = [p.strip().lower() for p in (text or "").split(",")]
    if not text or not text.strip() or any(not p for p in parts):
        raise InputError(f"--parallel {text!r}: give {PARALLEL_HELP}")
    if parts == ["search"]:
        return Layout(checkpointing=checkpointing), True
    degrees: dict[str, int] = {}
    shard = None
    for p in parts:
        m = _DEGREE.match(p)
        if p in SHARDS:
            if shard is not None:
                raise InputError(f"--parallel {text!r}: give one of {', '.join(SHARDS)}")
            shard = p
        elif m:
            key, value = m.group(1), int(m.group(2))
            if key in degrees:
                raise InputError(f"--parallel {text!r}: {key} is given twice")
            if not 1 <= value <= MAX_DEGREE:
                raise InputError(f"--parallel {text!r}: {key} must be from 1 to {MAX_DEGREE}")
            degrees[key] = value
        else:
            raise InputError(f"--parallel {text!r}: {p!r} is not {', '.join(SHARDS)}, search, tp=T, pp=P or dp=D")
    return Layout(degrees.get("tp", 1), degrees.get("pp", 1), degrees.get("dp"), shard or "ddp", checkpointing), False


def check(layout: Layout, facts, gpus: int | None, gpus_per_node: int | None) -> None:
    """The degrees against the model and the GPUs: tensor and pipeline parallelism need a
    GPT-shaped model (layers, width, heads); tp divides the heads and stays within a node; pp
    divides the layers; tp x pp x dp is the GPUs asked. InputError (exit 2) otherwise."""
    if layout.checkpointing and (facts.shape is None or not facts.tokens_per_sample):
        raise InputError(f"--checkpointing: the plan models recomputation through the activation formula of a "
                         f"GPT-shaped model (layers, width, heads); {facts.key} is not one")
    if layout.plain:
        if layout.dp is not None and gpus is not None and layout.dp != gpus:
            raise InputError(f"--parallel dp={layout.dp}: {gpus} GPUs are {gpus} data-parallel ranks without tp or "
                             f"pp; give --gpus {layout.dp} or leave dp out")
        return
    shape = facts.shape
    if shape is None or not facts.blocks:
        raise InputError(f"--parallel tp/pp: tensor and pipeline parallelism are planned for GPT-shaped models "
                         f"(layers, width, heads); {facts.key} is not one: give {', '.join(SHARDS)}")
    if shape.heads % layout.tp or shape.width % layout.tp:
        raise InputError(f"--parallel tp={layout.tp}: it must divide the {shape.heads} attention heads and the width "
                         f"{shape.width}")
    if facts.blocks % layout.pp:
        raise InputError(f"--parallel pp={layout.pp}: it must divide the {facts.blocks} layers into equal stages")
    if gpus_per_node and layout.tp > gpus_per_node:
        raise InputError(f"--parallel tp={layout.tp}: tensor parallelism stays within a node of {gpus_per_node} GPUs "
                         "(its collectives run every layer): give tp <= the GPUs per node and more pp, or --gpus-per-node where "
                         "the cluster's nodes have more GPUs than the stored runs' hosts")
    if layout.dp is not None and gpus is not None and layout.model_gpus * layout.dp != gpus:
        raise InputError(f"--parallel tp={layout.tp},pp={layout.pp},dp={layout.dp}: that is "
                         f"{layout.model_gpus * layout.dp} GPUs, not the {gpus} asked: give --gpus "
                         f"{layout.model_gpus * layout.dp} or other degrees")
    if gpus is not None and layout.ranks(gpus) is None:
        raise InputError(f"--parallel tp={layout.tp},pp={layout.pp}: {gpus} GPUs are not a multiple of tp x pp = "
                         f"{layout.model_gpus}: give --gpus {max(1, gpus // layout.model_gpus) * layout.model_gpus} "
                         "or other degrees")


def candidates(facts, gpus_per_node: int, checkpointing: tuple[bool, ...] = (False, True)) -> list[Layout]:
    """The layouts `search` tries: tp a power of two up to the node that divides the heads and the
    width, pp a divisor of the layers (up to 128 stages), DDP, ZeRO-1, ZeRO-2 or FSDP over the
    replicas, with and without recomputation; data parallelism alone for models that are not
    GPT-shaped."""
    shape = facts.shape
    if shape is None or not facts.blocks or not facts.tokens_per_sample:
        return [Layout(shard=s) for s in SHARDS]
    out = [Layout(shard=s, checkpointing=c) for s in SHARDS for c in checkpointing]
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= gpus_per_node and not shape.heads % t and not shape.width % t]
    pps = [p for p in range(1, min(facts.blocks, 128) + 1) if not facts.blocks % p]
    for t in tps:
        for p in pps:
            if t == 1 and p == 1:
                continue
            out += [Layout(t, p, None, s, c) for s in SHARDS for c in checkpointing]
    return out

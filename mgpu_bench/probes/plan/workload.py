"""The workload a plan is for, reduced to what the plan computes with: parameters, their tensors
(DDP's buckets), the repeated blocks (FSDP's units), tokens per sample, FLOPs per sample, and for a
GPT-shaped model its layers, width and heads (the activation formula). Built through
mgpu_bench.workloads on the meta device (shapes, no memory), as every probe builds its workload;
a bare size (layers=L,width=D) is the built-in GPT at those sizes, its tensors written out from
the GPT's layout (workloads/gpt.py) instead of built: 10,000 layers answer at once."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mgpu_bench.core.errors import InputError

from .config import BareSize, parse_bare_size


@dataclass(frozen=True)
class Facts:
    """key: the history name its runs are stored under; kind: gpt, torchvision, hf, module or bare;
    params and params_source ("counted ..." or "formula: ..."); tensors: each parameter's element
    count in registration order, shared ones once; blocks x block_params: the repeated blocks;
    shape: layers, width, heads, vocab where the model is GPT-shaped (else None); flops_per_sample
    of one forward and backward and where it comes from; default_batch per GPU; block_tensors:
    one block's parameter tensors (a pipeline stage's DDP buckets)."""

    key: str
    text: str
    kind: str
    params: int
    params_source: str
    tokens_per_sample: int | None
    seq_len: int | None
    image_size: int | None
    tensors: tuple[int, ...]
    blocks: int
    block_params: int
    shape: BareSize | None
    flops_per_sample: float | None
    flops_source: str
    default_batch: int
    block_tensors: tuple[int, ...] = ()

    @property
    def other_params(self) -> int:
        """Parameters outside the repeated blocks (embeddings, heads, final norms)."""
        return max(0, self.params - self.blocks * self.block_params)

    @property
    def sample_text(self) -> str:
        if self.tokens_per_sample:
            return f"seq {self.tokens_per_sample}"
        return f"{self.image_size} px" if self.image_size else "the module's batches"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tensors"] = len(self.tensors)  # the count: the list itself is rebuilt from the model
        d["block_tensors"] = len(self.block_tensors)
        d["shape"] = None if self.shape is None else asdict(self.shape)
        return d


def describe(text: str, seq_len: int | None, on_gpu: bool, image_size: int | None = None) -> Facts:
    """The workload `text` names (any form `model` takes, or a bare size), at `seq_len` tokens per
    sample or `image_size` pixels (None: its default; the CPU default where the plan is for CPU
    processes). InputError (exit code 2) for one that cannot be built, in one line."""
    from mgpu_bench import workloads

    bare = parse_bare_size(text)
    if bare is not None and image_size is not None:
        raise InputError(f"--image-size does not apply to {text}: a GPT has no images")
    if bare is not None:
        return _bare(text, bare, 2048 if seq_len is None else seq_len, on_gpu)
    w = workloads.resolve(text, seq_len=seq_len, image_size=image_size, cpu_defaults=not on_gpu)
    spec = getattr(w, "spec", None)
    shape = None if spec is None else BareSize(spec.layers, spec.d_model, spec.heads, spec.vocab)
    if w.kind == "gpt" and spec is not None and spec.mlp_ratio == 4:  # the built-in GPT: counted, not built
        return _gpt(text, w.key, "gpt", shape, spec.max_seq, int(w.seq_len), w.default_batch(on_gpu),
                    "counted from the GPT's layout (workloads/gpt.py)")
    try:
        model = w.build("meta")
        unique = {id(p): p for p in model.parameters()}.values()
        tensors = tuple(int(p.numel()) for p in unique)
        blocks = w.blocks(model)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - a model that cannot be built is bad input, in one line
        raise InputError(f"--model {text}: the model cannot be built ({workloads.last_line(exc)})") from None
    block_tensors = tuple(int(p.numel()) for p in blocks[0].parameters()) if blocks else ()
    flops, flops_source = _flops(w)
    return Facts(key=w.key, text=text, kind=w.kind, params=sum(tensors), params_source="counted on the meta device "
                 "(workloads)", tokens_per_sample=w.tokens_per_sample, seq_len=w.seq_len, image_size=w.image_size,
                 tensors=tensors, blocks=len(blocks), block_params=sum(block_tensors), shape=shape,
                 flops_per_sample=flops, flops_source=flops_source, default_batch=w.default_batch(on_gpu),
                 block_tensors=block_tensors)


def gpt_block_tensors(d: int, mlp_ratio: int = 4) -> tuple[int, ...]:
    """One block of the built-in GPT in registration order (workloads/gpt.py Block): ln1, the qkv and
    output projections, ln2, the MLP's two linears, each weight then its bias."""
    h = mlp_ratio * d
    return (d, d, 3 * d * d, 3 * d, d * d, d, d, d, h * d, h, h * d, d)


def _bare(text: str, bare: BareSize, seq: int, on_gpu: bool) -> Facts:
    """A bare size: the built-in GPT at these sizes (its positions as long as the sequence)."""
    if not 1 <= seq <= 1 << 20:
        raise InputError(f"--seq-len {seq}: give 1 to 1048576 tokens")
    return _gpt(text, bare.key, "bare", bare, seq, seq, 8 if on_gpu else 4,
                "formula: GPT (V + T) d + L (12 d^2 + 13 d) + 2 d")


def _gpt(text: str, key: str, kind: str, shape: BareSize, positions: int, seq: int, default_batch: int,
         source: str) -> Facts:
    """The built-in GPT's tensors at `shape`, written out from its layout instead of built (a
    10,000-layer size answers at once, and a bare size imports no torch). Its FLOPs per token are
    workloads/gpt.py's flops_per_token, 6N + 12 L d T (Kaplan et al. 2020; the PaLM paper's
    appendix B); a test holds the tensors, N and the FLOPs equal to the built model's."""
    d, block = shape.width, gpt_block_tensors(shape.width)
    tensors = (shape.vocab * d, positions * d, *(block * shape.layers), d, d)  # token table (the LM head), positions, ln_f
    params = sum(tensors)
    per_token = 6.0 * params + 12.0 * shape.layers * d * seq
    return Facts(key=key, text=text, kind=kind, params=params, params_source=source, tokens_per_sample=seq,
                 seq_len=seq, image_size=None, tensors=tensors, blocks=shape.layers, block_params=sum(block),
                 shape=shape, flops_per_sample=per_token * seq, flops_source="formula: 6N + 12 L d T per token",
                 default_batch=default_batch, block_tensors=block)


def _flops(w) -> tuple[float | None, str]:
    """FLOPs of one sample's forward and backward: the published formula where the workload has one
    (the GPT's 6N + 12 L d T), else counted by FlopCounterMode on the meta device."""
    formula = w.formula_flops(1)
    if formula is not None:
        return float(formula[0]), f"formula: {formula[1]} per token"
    try:
        count = w.count_flops(1, "meta")
    except Exception as exc:  # noqa: BLE001 - a model meta cannot run: no FLOP figure, said so
        from mgpu_bench.workloads import last_line

        return None, f"not counted: {last_line(exc)}"
    return float(count.per_sample), "counted by FlopCounterMode on the meta device"

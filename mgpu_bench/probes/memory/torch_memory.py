"""The PyTorch caching-allocator part of `mgpu-bench memory`: what fragmentation costs a training
loop under each allocator setting, and the largest batch that fits.

PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF are read once, when CUDA's allocator first starts,
so every setting runs in a fresh child process:

    python -m mgpu_bench.probes.memory.torch_memory workload --model 350m --batch 8 --seq-lens 256-2048 ...
    python -m mgpu_bench.probes.memory.torch_memory maxbatch --model torchvision:resnet50 --image-size 224 ...

The parent-side functions (run_setting, max_batch) start that child with the setting in its
environment and read back the JSON it writes; a child that crashes or runs out of time becomes a
dict with "error" (the last line of its stderr), never an exception. The child exits 0 on
success, 1 when it cannot run (no CUDA GPU, a CUDA error), 2 on bad arguments, each time with one
line on stderr.

All sizes are bytes; GiB appear only in `verdict`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import subprocess
import sys
import time
from typing import Any

from mgpu_bench.core import children
from mgpu_bench.core.errors import InputError

GIB = 2**30

# name -> PYTORCH_CUDA_ALLOC_CONF value (None: the variable is removed, torch's defaults apply)
SETTINGS: dict[str, str | None] = {
    "default": None,
    "expandable": "expandable_segments:True",
    "async": "backend:cudaMallocAsync",
    "split512": "max_split_size_mb:512",
}

# Both names are set to the same value: torch >= 2.9 reads PYTORCH_ALLOC_CONF first (and calls
# the CUDA-only name deprecated), older releases read only PYTORCH_CUDA_ALLOC_CONF.
CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")

SEQ_STEP = 128  # granularity of "A-B" sequence-length ranges
_KEY = re.compile(r"[a-z][a-z0-9_]*\Z")
_VALUE = re.compile(r"[A-Za-z0-9_.>:,\[\]]+\Z")  # "True", "512", "cudaMallocAsync", "[256:1,>:4]"


# ---------------------------------------------------------------------------------------------
# Settings and sequence-length specs


def _split_top_level(text: str, sep: str) -> list[str]:
    """Splits on `sep` outside square brackets (roundup_power2_divisions:[256:1,>:4])."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InputError(f"allocator setting {text!r}: unbalanced ']'")
        if ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise InputError(f"allocator setting {text!r}: unbalanced '['")
    parts.append("".join(current))
    return parts


def parse_settings(text: str) -> dict[str, str | None]:
    """Allocator settings to compare -> {label: conf}, conf None for torch's defaults.

    Items are separated by commas (or ';'). An item is a name from SETTINGS (label = name) or a
    raw `key:value` option; consecutive raw options join into one conf string, so
    "default,expandable_segments:True,max_split_size_mb:256" is two settings, the second
    "expandable_segments:True,max_split_size_mb:256" (label = the conf). Use ';' to keep two raw
    confs apart. "all" means every named setting. InputError on anything else.
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"no allocator setting given; choose from {', '.join(SETTINGS)} "
                         "or a PYTORCH_CUDA_ALLOC_CONF string such as expandable_segments:True")
    out: dict[str, str | None] = {}
    for group in _split_top_level(text, ";"):
        raw: list[str] = []
        for item in _split_top_level(group, ","):
            item = item.strip()
            if not item:
                continue
            name = item.lower()
            if name == "all":
                _flush(raw, out)
                out.update(SETTINGS)
            elif name in SETTINGS:
                _flush(raw, out)
                out[name] = SETTINGS[name]
            elif ":" in item:
                key, _, value = item.partition(":")
                key, value = key.strip(), value.strip()
                if not _KEY.match(key) or not value or not _VALUE.match(value):
                    raise InputError(f"allocator option {item!r} is not key:value "
                                     "(e.g. max_split_size_mb:512)")
                raw.append(f"{key}:{value}")
            else:
                raise InputError(f"unknown allocator setting {item!r}; choose from "
                                 f"{', '.join(SETTINGS)}, all, or key:value options "
                                 "(e.g. expandable_segments:True)")
        _flush(raw, out)
    if not out:
        raise InputError(f"no allocator setting in {text!r}")
    return out


def _flush(raw: list[str], out: dict[str, str | None]) -> None:
    """Consecutive raw options -> one setting (labelled by its name when it is a named one)."""
    if raw:
        conf = ",".join(raw)
        named = [n for n, c in SETTINGS.items() if c == conf]
        out[named[0] if named else conf] = conf
        raw.clear()


def _resolve_setting(setting: str) -> tuple[str, str | None]:
    """One setting name or conf -> (label, conf)."""
    if isinstance(setting, str) and setting.strip().lower() in SETTINGS:
        name = setting.strip().lower()
        return name, SETTINGS[name]
    parsed = parse_settings(setting)
    if len(parsed) != 1:
        raise InputError(f"{setting!r} is {len(parsed)} allocator settings; give one")
    return next(iter(parsed.items()))


def parse_seq_lens(text: str) -> list[int]:
    """Sequence lengths a workload draws from: "2048"; "256-2048" (every multiple of the step
    from 256 to 2048, step 128); "256-2048:64" (step 64); or a list "512,1024,2048"."""
    s = str(text).strip()
    try:
        if "-" in s:
            span, _, step_text = s.partition(":")
            lo_text, _, hi_text = span.partition("-")
            lo, hi = int(lo_text), int(hi_text)
            step = int(step_text) if step_text else SEQ_STEP
            if step < 1 or lo < 1 or hi < lo:
                raise ValueError
            values = list(range(lo, hi + 1, step))
        else:
            values = [int(v) for v in s.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise InputError(f"bad sequence lengths {text!r}: use 2048, 256-2048 (steps of "
                         f"{SEQ_STEP}), 256-2048:64 or 512,1024,2048")
    return values


def draw_seq_lens(choices: list[int], steps: int, seed: int) -> list[int]:
    """The sequence length of each step, uniform over `choices`, the same for every setting
    (Python's Mersenne Twister seeded with `seed`)."""
    rng = random.Random(seed)
    return [rng.choice(choices) for _ in range(steps)]


# ---------------------------------------------------------------------------------------------
# Child side: runs on the GPU, in a process of its own


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower()
                                              or "CUBLAS_STATUS_ALLOC_FAILED" in text)


def _stat(stats: dict, key: str, native: bool) -> int | None:
    """A memory_stats entry; None where the backend does not keep it (cudaMallocAsync reports
    only allocated/active/reserved bytes and leaves the rest at zero)."""
    if not native:
        return None
    value = stats.get(key)
    return int(value) if value is not None else None


def _free_blocks(device) -> dict[str, int | None]:
    """Free (inactive) blocks inside the allocator's reserved segments, from its snapshot:
    the largest one and their total. None on backends without a snapshot (cudaMallocAsync)."""
    import torch

    try:
        snapshot = torch.cuda.memory._snapshot(device)
    except (RuntimeError, AttributeError):  # cudaMallocAsync: "Calling snapshot ... is not meaningful"
        return {"largest_free_block_bytes": None, "free_in_segments_bytes": None, "segments": None}
    index = torch.device(device).index
    segments = [s for s in snapshot.get("segments", []) if s.get("device", index) == index]
    sizes = [b["size"] for s in segments for b in s.get("blocks", []) if b.get("state") == "inactive"]
    return {"largest_free_block_bytes": max(sizes, default=0),
            "free_in_segments_bytes": sum(sizes), "segments": len(segments)}


def _environment(device) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(device)
    return {
        "device": str(device),
        "gpu_name": props.name,
        "total_memory_bytes": int(props.total_memory),
        "allocator_backend": torch.cuda.get_allocator_backend(),
        "alloc_conf": {var: os.environ.get(var) for var in CONF_VARS},
        "torch_version": torch.__version__,
    }


def _cuda_device(text: str):
    """The --device argument, checked; exits 1 with one line when CUDA is missing."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise InputError(f"bad --device {text!r}: {exc}") from None
    if device.type != "cuda":
        raise InputError(f"--device {text!r}: the workload needs a CUDA device such as cuda:0")
    if not torch.cuda.is_available():
        raise _NeedsGpu("this workload needs a CUDA GPU (torch.cuda.is_available() is False)")
    index = 0 if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise _NeedsGpu(f"{text}: only {torch.cuda.device_count()} CUDA device(s) visible")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


class _NeedsGpu(RuntimeError):
    """The child cannot run here (exit code 1)."""


def run_workload(model: str, batch: int, seq_lens: str, steps: int, seed: int,
                 device: str = "cuda:0") -> dict[str, Any]:
    """Child side of run_setting: `steps` training steps of GPT(model) with `batch` sequences
    per step, each step's length drawn from `seq_lens` (varied shapes fragment the cache); bf16
    autocast, AdamW. Records allocated/reserved after every step and, at the end, the
    allocator's peaks, counters and free blocks. An OOM in a step is caught, counted (the
    step's "ok" is False) and the run goes on."""
    import torch

    from mgpu_bench.workloads.gpt import GPT, get_model_spec, make_optimizer

    spec = get_model_spec(model)
    choices = parse_seq_lens(seq_lens)
    if batch < 1 or steps < 1:
        raise InputError(f"--batch and --steps must be positive (got {batch}, {steps})")
    if max(choices) > spec.max_seq:  # learned positions: widen the table for longer sequences
        from dataclasses import replace

        spec = replace(spec, max_seq=max(choices))
    dev = _cuda_device(device)
    lens = draw_seq_lens(choices, steps, seed)

    torch.manual_seed(seed)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    net = GPT(spec, device=dev)
    opt = make_optimizer(net)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)

    allocated, reserved, ok, errors = [], [], [], []
    t0 = time.perf_counter()
    for seq_len in lens:
        step_ok, message = _guarded_step(net, opt, spec, batch, seq_len, dev, gen)
        if not step_ok:
            opt.zero_grad(set_to_none=True)
            gc.collect()
            errors.append(message)
        ok.append(step_ok)
        allocated.append(torch.cuda.memory_allocated(dev))
        reserved.append(torch.cuda.memory_reserved(dev))
    torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0

    stats = torch.cuda.memory_stats(dev)
    native = torch.cuda.get_allocator_backend() == "native"
    peak_alloc = stats.get("allocated_bytes.all.peak", max(allocated))
    peak_reserved = stats.get("reserved_bytes.all.peak", max(reserved))
    out: dict[str, Any] = {
        "kind": "workload",
        "model": spec.name, "params": sum(p.numel() for p in net.parameters()),
        "max_seq": spec.max_seq, "batch": batch, "seq_lens": seq_lens, "steps": steps,
        "seed": seed, **_environment(dev),
        "step_seq_lens": lens, "step_ok": ok,
        "step_allocated_bytes": allocated, "step_reserved_bytes": reserved,
        "seconds": seconds,
        "peak_allocated_bytes": int(peak_alloc), "peak_reserved_bytes": int(peak_reserved),
        # The cache's high-water mark beyond what tensors ever needed at once.
        "reserved_unallocated_at_peak_bytes": int(peak_reserved - peak_alloc),
        "end_allocated_bytes": allocated[-1], "end_reserved_bytes": reserved[-1],
        "end_reserved_unallocated_bytes": reserved[-1] - allocated[-1],
        "inactive_split_peak_bytes": _stat(stats, "inactive_split_bytes.all.peak", native),
        "inactive_split_current_bytes": _stat(stats, "inactive_split_bytes.all.current", native),
        "num_alloc_retries": _stat(stats, "num_alloc_retries", native),
        "num_ooms": _stat(stats, "num_ooms", native),
        "caught_ooms": ok.count(False),
        "oom_messages": errors[:3],
    }
    out.update(_free_blocks(dev))  # free blocks after the last step, model and optimizer live
    return out


def _guarded_step(net, opt, spec, batch, seq_len, dev, gen) -> tuple[bool, str]:
    """Two-level so that an OOM's traceback (and the activations its frames hold) is gone
    before the caller frees memory."""
    import torch

    from mgpu_bench.workloads.gpt import synthetic_batch, train_step

    try:
        tokens, targets = synthetic_batch(spec, batch, seq_len, dev, gen)
        train_step(net, opt, tokens, targets, torch.bfloat16)
        return True, ""
    except Exception as exc:  # only OOMs are swallowed
        if not _is_oom(exc):
            raise
        return False, str(exc).splitlines()[0][:300]


def find_max_batch(model: str, seq_len: int | None, checkpointing: bool, device: str = "cuda:0",
                   limit: int | None = None, time_budget_s: float | None = None,
                   image_size: int | None = None) -> dict[str, Any]:
    """Child side of max_batch: the largest per-GPU batch of the workload `model` names
    (workloads.resolve: the GPT sizes, torchvision:NAME, hf:NAME, module:function) for which two
    training steps (forward, backward, optimizer step; the second with optimizer state) run
    without OOM.

    Batches 1, 2, 4, ... until the first OOM (or `limit`), then a binary search between the last
    that fit and the first that did not. The model and optimizer are built once and kept across
    trials that fit; after an OOM everything is freed (del, gc.collect, empty_cache) and rebuilt,
    and the cache is emptied before every trial so that each starts from the same state. Stops
    early, with "complete": False, once `time_budget_s` has passed. device "cpu" runs the same
    steps up to `limit`, which it needs (nothing runs out of memory there): the workload's own
    steps checked where there is no GPU.
    """
    import torch

    from mgpu_bench import workloads

    wl = workloads.resolve(model, seq_len=seq_len, image_size=image_size)
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: must be positive")
    if device == "cpu":
        if limit is None:
            raise InputError("--device cpu needs --limit: nothing runs out of memory there")
        dev = torch.device("cpu")
    else:
        dev = _cuda_device(device)
    cuda = dev.type == "cuda"
    t_start = time.perf_counter()
    state: dict[str, Any] = {}

    def build() -> None:
        torch.manual_seed(0)
        state["net"] = wl.build(dev, checkpointing=checkpointing)
        state["opt"] = wl.optimizer(state["net"])
        state["gen"] = torch.Generator(device=dev)
        state["gen"].manual_seed(0)

    build()
    if cuda:
        torch.cuda.synchronize(dev)
    setup_s = time.perf_counter() - t_start
    trials: list[dict[str, Any]] = []

    def trial(batch: int) -> bool:
        if "net" not in state:
            build()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        ok, message = _trial_steps(state, wl, batch, dev)
        if ok and cuda:
            torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - t0
        row = {"batch": batch, "ok": ok, "seconds": seconds,
               "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(dev)) if cuda else None}
        if not ok:
            row["error"] = message
            state.clear()  # drop model, optimizer state and generator; rebuilt on the next trial
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        trials.append(row)
        return ok

    def out_of_time() -> bool:  # batch 1 is always tried
        return bool(trials) and time_budget_s is not None and \
            time.perf_counter() - t_start > time_budget_s

    good, bad, complete = 0, None, True
    batch = 1
    while True:  # grow
        if out_of_time():
            complete = False
            break
        if trial(batch):
            good = batch
            if limit is not None and batch >= limit:
                break
            batch = batch * 2 if limit is None else min(batch * 2, limit)
        else:
            bad = batch
            break
    while complete and bad is not None and bad - good > 1:  # binary search in (good, bad)
        if out_of_time():
            complete = False
            break
        mid = (good + bad) // 2
        if trial(mid):
            good = mid
        else:
            bad = mid
    best = next((t for t in reversed(trials) if t["ok"] and t["batch"] == good), None)
    tokens = wl.tokens_per_sample
    return {
        "kind": "maxbatch",
        "model": wl.key, "params": wl.param_count(),
        "seq_len": wl.seq_len, "image_size": wl.image_size, "checkpointing": checkpointing, "limit": limit,
        "time_budget_s": time_budget_s, **(_environment(dev) if cuda else {"device": str(dev)}),
        "max_batch": good, "first_oom_batch": bad, "complete": complete,
        "tokens_per_step": good * tokens if tokens else None,
        "peak_allocated_bytes": best["peak_allocated_bytes"] if best else None,
        "trials": trials, "setup_seconds": setup_s,
        "seconds": time.perf_counter() - t_start,
    }


def _trial_steps(state: dict, wl, batch: int, dev) -> tuple[bool, str]:
    """Two train steps at `batch`; (False, message) on OOM, with no reference left to the
    failed step's tensors once this returns."""
    from mgpu_bench.workloads import train_step

    try:
        data = wl.batch(batch, dev, state["gen"])
        for _ in range(2):
            train_step(wl, state["net"], state["opt"], data, wl.autocast_dtype(dev))
        return True, ""
    except Exception as exc:  # only OOMs are swallowed
        if not _is_oom(exc):
            raise
        return False, str(exc).splitlines()[0][:300]


_PROG = "python -m mgpu_bench.probes.memory.torch_memory"


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (exit code 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog=_PROG,
                            description="Child process of `mgpu-bench memory` (one allocator "
                                        "setting per process).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    w = sub.add_parser("workload", help="variable-length training steps; allocator statistics")
    w.add_argument("--model", required=True)
    w.add_argument("--batch", type=int, required=True, help="sequences per step")
    w.add_argument("--seq-lens", required=True, help="2048, 256-2048[:step] or 512,1024,...")
    w.add_argument("--steps", type=int, default=60)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--device", default="cuda:0")
    w.add_argument("--json", required=True, help="where to write the result")
    m = sub.add_parser("maxbatch", help="largest batch that trains without OOM")
    m.add_argument("--model", required=True, help="a workload, as `mgpu-bench model --model` takes it")
    m.add_argument("--seq-len", type=int, default=None, help="tokens per sample [default: the workload's]")
    m.add_argument("--image-size", type=int, default=None, help="pixels per side, torchvision models")
    m.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=False)
    m.add_argument("--device", default="cuda:0", help="cuda:N, or cpu (up to --limit)")
    m.add_argument("--json", required=True)
    m.add_argument("--limit", type=int, default=None, help="largest batch to try")
    m.add_argument("--time-budget", type=float, default=None, help="seconds; stop searching after")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "workload":
            result = run_workload(args.model, args.batch, args.seq_lens, args.steps, args.seed,
                                  args.device)
        else:
            result = find_max_batch(args.model, args.seq_len, args.checkpointing, args.device,
                                    args.limit, args.time_budget, args.image_size)
    except InputError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    except _NeedsGpu as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 1
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


# ---------------------------------------------------------------------------------------------
# Parent side


def _child_env(conf: str | None) -> dict[str, str]:
    """The parent's environment (CUDA_VISIBLE_DEVICES, NCCL_NVLS_ENABLE and the rest unchanged)
    with only the allocator variables replaced."""
    env = dict(os.environ)
    for var in CONF_VARS:
        env.pop(var, None)
        if conf is not None:
            env[var] = conf
    return env


def _run_child(args: list[str], conf: str | None, timeout_s: float) -> dict[str, Any]:
    with children.temp_folder("mgpu-mem-") as tmp:
        path = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "mgpu_bench.probes.memory.torch_memory", *args, "--json", path]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, check=False, env=children.child_env(_child_env(conf)), capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:g} s", "returncode": None,
                    "wall_s": time.perf_counter() - t0}
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            lines = [ln.strip() for ln in (proc.stderr or "").splitlines() if ln.strip()]
            last = lines[-1] if lines else f"exited with code {proc.returncode} and no message"
            return {"error": last, "returncode": proc.returncode, "wall_s": wall}
        try:
            with open(path) as f:
                result = json.load(f)
        except (OSError, ValueError) as exc:
            return {"error": f"no readable result from the child: {exc}", "returncode": 0,
                    "wall_s": wall}
    result.update(returncode=0, wall_s=wall)
    return result


def run_setting(setting: str, model: str, batch: int, seq_lens: str, steps: int, seed: int = 0,
                device_index: int = 0, timeout_s: float = 600.0) -> dict[str, Any]:
    """Runs the variable-length workload under one allocator setting (a SETTINGS name or a
    PYTORCH_CUDA_ALLOC_CONF string) in a fresh process on GPU `device_index` (an index among the
    visible devices). Returns the child's dict (see run_workload) plus "setting" (label),
    "conf", "returncode", "wall_s"; or {"setting", "conf", "error", "returncode", "wall_s"}
    when the child fails or times out. InputError only for a bad setting."""
    label, conf = _resolve_setting(setting)
    args = ["workload", "--model", str(model), "--batch", str(batch), "--seq-lens", str(seq_lens),
            "--steps", str(steps), "--seed", str(seed), "--device", f"cuda:{device_index}"]
    result = _run_child(args, conf, timeout_s)
    result.update(setting=label, conf=conf)
    return result


def max_batch(model: str, seq_len: int | None, checkpointing: bool = False, setting: str = "default",
              device_index: int | str = 0, timeout_s: float = 600.0, limit: int | None = None,
              time_budget_s: float | None = None, image_size: int | None = None) -> dict[str, Any]:
    """The largest per-GPU batch of the workload `model` (at `seq_len` tokens or `image_size`
    pixels, None: its default) under one allocator setting, found in a fresh process (see
    find_max_batch for the search and the keys), plus "setting", "conf", "returncode", "wall_s";
    or a dict with "error" when the child fails or times out. device_index "cpu": find_max_batch's."""
    label, conf = _resolve_setting(setting)
    args = ["maxbatch", "--model", str(model), "--checkpointing" if checkpointing else "--no-checkpointing",
            "--device", "cpu" if device_index == "cpu" else f"cuda:{device_index}"]
    if seq_len is not None:
        args += ["--seq-len", str(seq_len)]
    if image_size is not None:
        args += ["--image-size", str(image_size)]
    if limit is not None:
        args += ["--limit", str(limit)]
    if time_budget_s is not None:
        args += ["--time-budget", str(time_budget_s)]
    result = _run_child(args, conf, timeout_s)
    result.update(setting=label, conf=conf)
    return result


def _gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.1f}"


def _label(name: str, result: dict) -> str:
    return result.get("conf") or name


def verdict(results: dict[str, dict]) -> str:
    """One line on what fragmentation costs under the default allocator and which setting gets
    most of it back, from run_setting results keyed by setting label.

    Fragmentation cost = peak reserved - peak allocated ("reserved but unallocated at peak");
    a setting "recovers" the drop of that figure from the default's. The free-block figures are
    the allocator's snapshot after the last step.
    """
    failed = [name for name, r in results.items() if r.get("error")]
    tail = f" ({', '.join(failed)} failed: {results[failed[0]]['error'][:120]})" if failed else ""
    base = results.get("default")
    if base is None or base.get("error"):
        return f"no default-allocator result to compare against{tail}"
    frag = base.get("reserved_unallocated_at_peak_bytes") or 0
    head = f"default: {_gib(frag)} GiB reserved but unallocated at peak"
    if base.get("free_in_segments_bytes") is not None:
        head += (f", largest free block {_gib(base.get('largest_free_block_bytes'))} of "
                 f"{_gib(base['free_in_segments_bytes'])} GiB free in the cache")
    if base.get("caught_ooms"):
        head += f", {base['caught_ooms']} step(s) ran out of memory"
    others = {n: r for n, r in results.items() if n != "default" and not r.get("error")}
    if not others:
        return f"{head}; no other setting to compare{tail}"
    saved = {n: frag - (r.get("reserved_unallocated_at_peak_bytes") or 0) for n, r in others.items()}
    best = max(saved, key=lambda n: saved[n])
    r = others[best]
    # Below 64 MiB or 10% of the default's cost the difference is noise from one step to the next.
    if frag < 256 * 2**20:
        return f"{head}: fragmentation is negligible, no setting needed{tail}"
    if saved[best] < max(64 * 2**20, 0.1 * frag):
        return (f"{head}; no setting recovers a meaningful part of it (best: {_label(best, r)}, "
                f"{_gib(saved[best])} GiB){tail}")
    line = f"{head}; {_label(best, r)} recovers {_gib(saved[best])} GiB"
    if r.get("largest_free_block_bytes") is not None:
        line += (f" (largest block {_gib(r['largest_free_block_bytes'])} of "
                 f"{_gib(r.get('free_in_segments_bytes'))} GiB free)")
    if (r.get("caught_ooms") or 0) > (base.get("caught_ooms") or 0):
        line += f" but {r['caught_ooms']} step(s) ran out of memory"
    return line + tail


if __name__ == "__main__":
    sys.exit(main())

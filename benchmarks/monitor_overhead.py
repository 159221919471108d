"""StepMonitor's cost inside a training loop, and its figures beside `mgpu-bench model`'s.

The loop is plain_gpt_loop.py's: the built-in GPT, synthetic tokens made on the device, bf16
autocast and fused AdamW on a GPU (fp32 on CPU). After warm-up, `--reps` pairs of blocks of
`--steps` steps each, the plain loop and the same loop inside `with mon.step(): with
mon.compute():` (a StepMonitor with warm-up 0, no FLOP count, no profile, nothing stored: the hot
path alone), in alternating order (ABBA) so that a drift of the machine falls on both; each
block timed by the host clock with one synchronize at each end. The overhead is the median over
the pairs of (monitored block / plain block - 1); its noise the spread of the plain blocks
among themselves (1.4826 x MAD / median). Then one monitored run with the defaults (warm-up,
FLOPs counted on the first step, the profiled window, the ceiling at finish()) prints its
report, and `mgpu-bench model` runs the same model, batch and sequence length; both lines are
printed with their difference.

    python benchmarks/monitor_overhead.py --model 350m --seq-len 2048 --batch-size 8 --steps 30 --reps 5
    python benchmarks/monitor_overhead.py --device cpu --model tiny --vocab 512 --seq-len 64 --batch-size 8 --steps 10 --reps 40
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _noise(xs: list[float]) -> float:
    med = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - med) for x in xs) / med if med else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="350m")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30, help="steps per timed block")
    ap.add_argument("--reps", type=int, default=5, help="pairs of blocks (plain, monitored)")
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--vocab", type=int, default=None, help="another vocabulary size (CPU: the embedding and loss of "
                                                           "50304 tokens dwarf a tiny model's blocks)")
    ap.add_argument("--no-model-cli", action="store_true", help="skip the `mgpu-bench model` run beside it")
    ap.add_argument("--store", action="store_true", help="keep the full monitored run in the history")
    args = ap.parse_args()

    import torch

    from mgpu_bench import StepMonitor
    from mgpu_bench.workloads import gpt as models

    spec = models.get_model_spec(args.model)
    if args.vocab:
        spec = dataclasses.replace(spec, vocab=args.vocab)
    cuda = args.device == "cuda"
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    torch.manual_seed(1234)
    model = models.GPT(spec, device=dev)
    opt = models.make_optimizer(model)
    amp = torch.bfloat16 if cuda else None
    gen = torch.Generator(device=dev).manual_seed(1234)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def plain(n: int) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            x, y = models.synthetic_batch(spec, args.batch_size, args.seq_len, dev, gen)
            models.train_step(model, opt, x, y, amp)
        sync()
        return time.perf_counter() - t0

    def monitored(n: int, mon) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            with mon.step(samples=args.batch_size):
                x, y = models.synthetic_batch(spec, args.batch_size, args.seq_len, dev, gen)
                with mon.compute():
                    models.train_step(model, opt, x, y, amp)
        sync()
        return time.perf_counter() - t0

    def bare_monitor():
        return StepMonitor("overhead", tokens_per_sample=args.seq_len, model=model, warmup=0, count_flops=False,
                           profile=False, ceiling=False, store=False, print=False)

    plain(args.warmup_steps)
    ratios, plains, mons = [], [], []
    for rep in range(args.reps):
        mon = bare_monitor()
        if rep % 2 == 0:
            p, m = plain(args.steps), monitored(args.steps, mon)
        else:
            m, p = monitored(args.steps, mon), plain(args.steps)
        mon.finish()
        plains.append(p)
        mons.append(m)
        ratios.append(m / p - 1)
    step_ms = 1e3 * statistics.median(plains) / args.steps
    print(f"plain loop {spec.name} seq {args.seq_len} batch {args.batch_size} on {dev}: {step_ms:.2f} ms/step "
          f"(median of {args.reps} blocks of {args.steps} steps; block-to-block noise {100 * _noise(plains):.2f}%)")
    med = statistics.median(ratios)
    # the median's standard error: 1.2533 x sigma / sqrt(n), sigma from the pairs' MAD (1.4826 x MAD)
    se = 1.2533 * 1.4826 * statistics.median(abs(r - med) for r in ratios) / len(ratios) ** 0.5
    print(f"monitored loop: {1e3 * statistics.median(mons) / args.steps:.2f} ms/step; overhead "
          f"{100 * med:+.3f}% +- {100 * se:.3f}% (median over {args.reps} ABBA pairs +- its standard error; pairs "
          f"range {100 * min(ratios):+.2f}% to {100 * max(ratios):+.2f}%; target < 1%)", flush=True)

    # the hot path alone: an empty step with compute, per call
    mon = bare_monitor()
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        with mon.step(samples=args.batch_size), mon.compute():
            pass
    hot = (time.perf_counter() - t0) / n
    mon.finish()
    print(f"monitor's own cost: {1e6 * hot:.1f} us per step (an empty step and compute, {n} of them, window edges "
          f"included): {100 * hot / (step_ms / 1e3):.4f}% of the plain step", flush=True)

    # the full monitor with its defaults, beside `mgpu-bench model`
    steps = max(args.steps, 20)
    mon = StepMonitor(f"overhead-{spec.name}", tokens_per_sample=args.seq_len, model=model, optimizer=opt,
                      store=args.store, warmup=args.warmup_steps, window=10)
    monitored(args.warmup_steps + 3 + steps, mon)
    doc = mon.finish()
    d = (doc.get("runs") or [{}])[0].get("derived") or {}
    if not d:
        sys.exit(f"the monitor measured nothing: {doc.get('status')}")
    mine = d["tokens_per_s"]
    print(f"monitor: {mine:,.0f} tokens/s, {1e3 * d['step_s']:.1f} ms/step"
          + (f", MFU {100 * d['mfu']:.1f}%" if d.get("mfu") is not None else ""), flush=True)
    if args.no_model_cli or args.vocab:
        if args.vocab:
            print("no `mgpu-bench model` beside it: it trains the built-in vocabulary, not --vocab")
        return
    model = opt = mon = None  # the model run beside it needs the memory
    if cuda:
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "model.json")
        cmd = [sys.executable, "-m", "mgpu_bench.cli", "model", "--model", spec.name, "--seq-len", str(args.seq_len),
               "--batch-size", str(args.batch_size), "--steps", str(steps), "--warmup-steps", str(args.warmup_steps),
               "--no-exposed-comm", "--no-store", "--json", out, "--no-progress"]
        cmd += ["--gpus", "1"] if cuda else ["--nproc", "1"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            theirs = json.load(f)["runs"][0]["derived"]
    print(f"mgpu-bench model: {theirs['tokens_per_s']:,.0f} tokens/s, {1e3 * theirs['step_s']:.1f} ms/step"
          + (f", MFU {100 * theirs['mfu']:.1f}%" if theirs.get("mfu") is not None else ""))
    print(f"monitor against model: {100 * (mine / theirs['tokens_per_s'] - 1):+.1f}% tokens/s (target within 3%)")


if __name__ == "__main__":
    main()

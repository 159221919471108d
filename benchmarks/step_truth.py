"""Issue 32 and 36 on one GPU: the monitor's headline against the loop's own wall clock, with and
without stalls; its overhead, and the noise scale's, in ABBA pairs.

The loop: the built-in GPT (350m shape, seq 2048, batch 8), bf16 autocast, fused AdamW, a fixed
set of 4 synthetic batches made before timing (ANCHORS, turn 4).

    truth     three monitored runs (StepMonitor's defaults: warm-up 5, FLOPs counted, 3 profiled
              steps, the ceiling at finish): no pause, a 0.5 s host pause every 10th step outside
              compute(), the same pause inside compute(). Each against the loop's own clock over
              the same timed steps (synchronize, perf_counter, the steps, synchronize): their ratio.
    overhead  ABBA pairs of blocks: the plain loop against the same loop inside mon.step() and
              mon.compute() (the hot path alone: warm-up 0, no count, no profile, no ceiling).
    noise     the same under DDP on this one GPU (NCCL, world 1): the plain DDP loop against it
              with the monitor's default marks, with noise_scale's norms as the monitor takes
              them (GradMarks), and in the communication hook (comm_hook=True; the monitor
              attaches them for 2+ ranks only, where the noise scale can be estimated; on one
              rank the benchmark attaches them itself to time their cost).

    reference the monitor's reference steps (issue 40: one step in 20 with the gradient sync off in
              its backward and the all-reduce run after it) with the default marks, against plain
              DDP (part of `noise`: name both).

    python benchmarks/step_truth.py truth overhead noise reference --reps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("parts", nargs="+", choices=["truth", "overhead", "noise", "reference"])
    ap.add_argument("--model", default="350m")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60, help="timed steps of a truth run")
    ap.add_argument("--block", type=int, default=20, help="steps per overhead block")
    ap.add_argument("--reps", type=int, default=5, help="ABBA pairs")
    ap.add_argument("--pause", type=float, default=0.5)
    ap.add_argument("--db", default=None, help="history for the truth runs [default: the user's]")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of the script")
    ap.add_argument("--marks-only", action="store_true", help="noise: only the monitor's default paths (its marks, with and without the noise norms) against plain DDP")
    args = ap.parse_args()

    import torch

    from mgpu_bench import StepMonitor
    from mgpu_bench.workloads import gpt as models

    cuda = args.device == "cuda"
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync_dev = torch.cuda.synchronize if cuda else (lambda: None)
    spec = models.get_model_spec(args.model)
    torch.manual_seed(1234)
    model = models.GPT(spec, device=dev)
    opt = models.make_optimizer(model)
    gen = torch.Generator(device=dev).manual_seed(1234)
    batches = [models.synthetic_batch(spec, args.batch_size, args.seq_len, dev, gen) for _ in range(4)]
    amp = torch.bfloat16 if cuda else None
    tokens = args.batch_size * args.seq_len

    def train(net, i):
        x, y = batches[i % 4]
        models.train_step(net, opt, x, y, amp)

    for i in range(5):
        train(model, i)
    sync_dev()

    if "truth" in args.parts:
        for where in ("none", "outside", "inside"):
            mon = StepMonitor(f"truth-{args.model}-{where}", tokens_per_sample=args.seq_len, model=model,
                              optimizer=opt, db=args.db, print=False)
            first = mon.warmup + (mon.profile_steps if cuda else 0)  # profiled steps (GPUs) are not timed
            total = first + args.steps
            t0 = 0.0
            for i in range(total):
                if i == first:
                    sync_dev()
                    t0 = time.perf_counter()
                with mon.step(samples=args.batch_size):
                    if where == "outside" and i % 10 == 9:
                        time.sleep(args.pause)
                    with mon.compute():
                        train(model, i)
                        if where == "inside" and i % 10 == 9:
                            time.sleep(args.pause)
            sync_dev()
            own = args.steps * tokens / (time.perf_counter() - t0)
            doc = mon.finish()
            d = doc["runs"][0]["derived"]
            s = doc["runs"][0].get("stalls") or {}
            verdict = next((f for f in doc["findings"] if "-bound" in f or "gap" in f), "-")
            print(f"truth {where}: loop's own wall clock {own:,.0f} tokens/s, monitor {d['tokens_per_s']:,.0f} "
                  f"({100 * (d['tokens_per_s'] / own - 1):+.2f}%), steady-state {d['steady_tokens_per_s']:,.0f} "
                  f"(median step {1e3 * d['step_s']:.1f} ms); stalls {s.get('count')} period {s.get('period')} share "
                  f"{100 * (s.get('share') or 0):.1f}% where {s.get('where')}; MFU {100 * (d.get('mfu') or 0):.1f}%",
                  flush=True)
            print(f"   verdict: {verdict}", flush=True)

    def blocks(name, plain, monitored):
        ratios, ps, ms = [], [], []
        for rep in range(args.reps):
            if rep % 2 == 0:
                p, m = plain(), monitored()
            else:
                m, p = monitored(), plain()
            ratios.append(m / p - 1)
            ps.append(p)
            ms.append(m)
        med = statistics.median(ratios)
        se = 1.2533 * 1.4826 * statistics.median(abs(r - med) for r in ratios) / len(ratios) ** 0.5
        print(f"{name}: plain {1e3 * statistics.median(ps) / args.block:.2f} ms/step, with it "
              f"{1e3 * statistics.median(ms) / args.block:.2f} ms/step: overhead {100 * med:+.3f}% +- {100 * se:.3f}% "
              f"(median of {args.reps} ABBA pairs of {args.block}-step blocks; pairs {100 * min(ratios):+.2f}% to "
              f"{100 * max(ratios):+.2f}%; target < 1%)", flush=True)

    def timed(fn):
        sync_dev()
        t0 = time.perf_counter()
        fn()
        sync_dev()
        return time.perf_counter() - t0

    if "overhead" in args.parts:
        def plain():
            return timed(lambda: [train(model, i) for i in range(args.block)])

        def monitored():
            mon = StepMonitor("overhead", tokens_per_sample=args.seq_len, model=model, warmup=0, count_flops=False,
                              profile=False, ceiling=False, store=False, print=False)

            def run():
                for i in range(args.block):
                    with mon.step(samples=args.batch_size), mon.compute():
                        train(model, i)
            t = timed(run)
            mon.finish()
            return t
        blocks("monitor (hot path)", plain, monitored)

    if "noise" in args.parts or "reference" in args.parts:
        import torch.distributed as dist

        from mgpu_bench.training.gradsync import GradSync

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29655")
        if cuda:
            dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
        else:
            dist.init_process_group("gloo", rank=0, world_size=1)
        ids = [0] if cuda else None
        plain_ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        hooked = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        sync = GradSync(cuda, noise=True)
        sync.attach(hooked)
        for i in range(3):
            train(plain_ddp, i)
            train(hooked, i)  # the hook's first steps (DDP rebuilds its buckets after the first)

        def plain():
            return timed(lambda: [train(plain_ddp, i) for i in range(args.block)])

        def with_monitor(every: int, noise: bool):
            def run_blocks():
                mon = StepMonitor("noise-overhead", tokens_per_sample=args.seq_len, model=hooked, warmup=0,
                                  count_flops=False, profile=False, ceiling=False, store=False, print=False,
                                  noise_scale=noise, noise_every=every)
                mon._sync = sync  # on one rank the monitor attaches nothing itself (no second batch size)
                sync.noise = sync.noise if noise else None

                def run():
                    for i in range(args.block):
                        with mon.step(samples=args.batch_size), mon.compute():
                            train(hooked, i)
                        if noise and (i + 1) % 10 == 0:
                            sync.noise.rotate()
                t = timed(run)
                mon.finish()
                return t
            return run_blocks

        from mgpu_bench.training.gradsync import Noise

        noise_obj = sync.noise
        from mgpu_bench.training.gradsync import GradMarks

        # The monitor's default for a DDP model: GradMarks (three marks a step from hooks on the model's tensors),
        # and with noise_scale=True its norms (per-parameter hooks in the steps that take them, one multi-tensor
        # norm after DDP's end of backward); DDP's all-reduce untouched either way. The hooks are attached for
        # the monitored block only, so the plain loop carries none.
        marked = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        for i in range(3):
            train(marked, i)
        marks_noise: list = []

        refs: list = []

        def with_marks(every: int | None = None, reference_every: int | None = None):
            def run_blocks():
                gm = GradMarks(cuda, noise=every is not None)
                gm.attach(marked)
                mon = StepMonitor("marks-overhead", tokens_per_sample=args.seq_len, model=marked, warmup=0,
                                  count_flops=False, profile=False, ceiling=False, store=False, print=False,
                                  noise_scale=every is not None, noise_every=every or 8)
                mon._sync = gm  # on one rank the monitor attaches nothing itself
                if reference_every:  # the monitor's reference steps (monitor/reference.py), as it sets them up
                    from mgpu_bench.monitor.reference import Reference

                    ref = Reference(marked, cuda, reference_every)
                    gm.after_backward = ref.after_backward
                    mon._reference = ref
                    refs.append(ref)

                def run():
                    for i in range(args.block):
                        if i == 1:  # the pools are made at the first step
                            for pool in (mon._pool, mon._other):
                                if pool is not None:
                                    pool.sync_read = gm.read
                        with mon.step(samples=args.batch_size), mon.compute():
                            train(marked, i)
                t = timed(run)
                mon.finish()
                gm.detach()
                if gm.noise is not None:
                    marks_noise.append(gm.noise)
                return t
            return run_blocks

        blocks("the monitor with its default gradient marks (hooks on the model's tensors, DDP's all-reduce untouched)",
               plain, with_marks())
        for every in (8, 1):
            blocks(f"noise_scale=True, noise_every={every} (the monitor's default: GradMarks' norms, DDP untouched)",
                   plain, with_marks(every))
        if "reference" in args.parts:
            blocks("reference steps, 1 in 20 (gradient sync off in the backward, the all-reduce after it, timed)",
                   plain, with_marks(None, 20))
            taken = [c for r in refs for c in (r.figures() or {}).get("comm_s", [])]
            if taken:
                print(f"reference steps: {len(taken)} taken, their all-reduce (flatten, NCCL on one rank, copy back) "
                      f"{1e3 * statistics.median(taken):.2f} ms median for "
                      f"{sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9:.2f} GB of gradients",
                      flush=True)
        got = [n for n in marks_noise if n.steps_total]
        if got:
            print(f"GradMarks' noise norms: {sum(n.steps_total for n in got)} norm steps, host time in its code "
                  f"{1e6 * sum(n.host_s for n in got) / sum(n.steps_total for n in got):.0f} us per norm step; "
                  f"{sum(len(n.windows()) for n in got)} windows read back", flush=True)
        if args.marks_only:
            dist.destroy_process_group()
            return
        blocks("the monitor with DDP's communication hook and its marks (comm_hook=True)", plain,
               with_monitor(1, False))
        for every in (1, 8):
            sync.noise = noise_obj if noise_obj is not None else Noise(cuda)
            blocks(f"noise_scale=True, noise_every={every} (the hook, its marks and norms, DDP on one GPU)", plain,
                   with_monitor(every, True))
        sync.noise = noise_obj
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        from mgpu_bench.training.gradsync import norm_cost

        print(f"noise scale's device norms, timed alone: {1e3 * (norm_cost(nbytes, dev) if cuda else 0):.3f} ms per "
              f"norm step for {nbytes / 1e9:.2f} GB of gradients; host time in its code "
              f"{1e6 * noise_obj.host_s / max(1, noise_obj.steps_total):.0f} us per norm step", flush=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

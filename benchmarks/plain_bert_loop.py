"""A plain hand-written training loop of BertForMaskedLM at BERT-large dimensions (24 layers, 1024
wide, 16 heads, FFN 4096, vocabulary 30522: Devlin et al. 2019), for `mgpu-bench model --model
hf:bert-large`'s overhead target: built from its config (random weights, no hub access), SDPA
attention, fp32 weights with bf16 autocast, fused AdamW (lr 1e-4, weight decay 0.01), random
token ids with 15% of the positions as masked-LM labels: one fixed batch made before timing (the
reference of issue 32: a launch-bound step shows any per-step work), or made on the device each
step with --fresh-batch; host clock around the timed steps with one synchronize at each end.

    python benchmarks/plain_bert_loop.py --seq-len 512 --batch-size 16 --steps 30

Set beside it: mgpu-bench model --model hf:bert-large --seq-len 512 --batch-size 16 --gpus 1
"""

from __future__ import annotations

import argparse
import os
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers  # after the offline switch: nothing is fetched from the hub


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--fresh-batch", action="store_true", help="a new batch made on the device every step")
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    torch.manual_seed(1234)
    cfg = transformers.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                  intermediate_size=4096, vocab_size=30522, max_position_embeddings=512)
    with torch.device(dev):
        model = transformers.AutoModelForMaskedLM.from_config(cfg, attn_implementation="sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    gen = torch.Generator(device=dev).manual_seed(1234)
    b, t = args.batch_size, args.seq_len

    def batch():
        ids = torch.randint(0, cfg.vocab_size, (b, t), device=dev, generator=gen)
        keep = torch.rand((b, t), device=dev, generator=gen) < 0.15
        return ids, torch.where(keep, ids, torch.full_like(ids, -100))

    fixed = batch()

    def step() -> None:
        ids, labels = batch() if args.fresh_batch else fixed
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup_steps):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.steps
    params = sum(p.numel() for p in model.parameters())
    print(f"plain loop BertForMaskedLM ({params / 1e6:.0f}M params) seq {t} batch {b}"
          f"{' (a fresh batch each step)' if args.fresh_batch else ' (one fixed batch)'}: {dt * 1e3:.1f} ms/step, "
          f"{b / dt:.0f} samples/s, {b * t / dt:.0f} tokens/s, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} "
          f"GiB allocated (torch {torch.__version__}, transformers {transformers.__version__})", flush=True)


if __name__ == "__main__":
    main()

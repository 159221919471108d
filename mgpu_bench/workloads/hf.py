"""`hf:NAME` and `hf:path/config.json`: a transformers model built from a config object with random
weights (AutoModelFor{MaskedLM,CausalLM}.from_config: no hub access, HF_HUB_OFFLINE=1), SDPA
attention, trained on random token ids with the masked-LM or causal-LM loss its architecture has;
bf16 autocast on GPUs, fused AdamW.

Presets, from the published dimensions of each model (other fields: transformers' defaults for
the architecture, which are those models' own):
    bert-base   12 layers, 768 wide, 12 heads, FFN 3072, vocab 30522, 512 positions
    bert-large  24 layers, 1024 wide, 16 heads, FFN 4096, vocab 30522, 512 positions
    gpt2        12 layers, 768 wide, 12 heads, vocab 50257, 1024 positions
    llama-1b    16 layers, 2048 wide, 32 heads (8 key/value heads), FFN 8192, vocab 128256, tied embeddings
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from pathlib import Path

from mgpu_bench.core.errors import InputError

from .base import Workload, safe_key
from .extras import auto_class, transformers_mismatch

# name -> (config class, loss, dimensions, default sequence length on GPUs)
PRESETS: dict[str, tuple[str, str, dict, int]] = {
    # Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
    # Understanding", section 3: BERT-BASE L=12, H=768, A=12; BERT-LARGE L=24, H=1024, A=16; the
    # feed-forward size 4H; the 30522-token WordPiece vocabulary and 512 positions of the released
    # checkpoints' config.json (google-bert/bert-base-uncased, bert-large-uncased).
    "bert-base": ("BertConfig", "masked", {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                                           "intermediate_size": 3072, "vocab_size": 30522,
                                           "max_position_embeddings": 512}, 512),
    "bert-large": ("BertConfig", "masked", {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                                            "intermediate_size": 4096, "vocab_size": 30522,
                                            "max_position_embeddings": 512}, 512),
    # Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", table 2 (the
    # smallest model: 12 layers, d_model 768), vocabulary 50257 and context 1024 (section 2.3);
    # 12 heads as openai-community/gpt2's config.json.
    "gpt2": ("GPT2Config", "causal", {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                                      "n_positions": 1024}, 1024),
    # Meta's Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json and model card): 16 layers, hidden
    # 2048, 32 heads with 8 key/value heads (grouped-query attention), FFN 8192, vocabulary 128256,
    # input and output embeddings tied. Its RoPE scaling is left at the default: it changes no
    # FLOP and no kernel.
    "llama-1b": ("LlamaConfig", "causal", {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                                           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                                           "max_position_embeddings": 131072, "tie_word_embeddings": True}, 2048),
}


def _transformers():
    """transformers with its torch models usable, or one line naming the fix (extras.py)."""
    from .extras import transformers

    os.environ["HF_HUB_OFFLINE"] = "1"  # the configs are built here; nothing is fetched from the hub
    return transformers()


def _task_of(config, transformers) -> str:
    """"masked" or "causal": the head the config's architectures name, else the one transformers
    has for its model type (masked first: an encoder such as BERT has both)."""
    try:
        from transformers.models.auto import modeling_auto
    except Exception as exc:  # noqa: BLE001 - a transformers that does not fit this torch
        raise transformers_mismatch(exc) from None

    for arch in getattr(config, "architectures", None) or []:
        if arch.endswith("ForMaskedLM"):
            return "masked"
        if arch.endswith(("ForCausalLM", "LMHeadModel")):
            return "causal"
    if config.model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "masked"
    if config.model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "causal"
    raise InputError(f"model type {config.model_type!r} has neither a masked-LM nor a causal-LM head in transformers "
                     f"{transformers.__version__}")


def _from_file(path: Path, transformers):
    """The config a config.json describes; InputError naming what is wrong with the file."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"hf:{path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputError(f"hf:{path} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise InputError(f"hf:{path}: a config.json needs a \"model_type\" (bert, gpt2, llama, ...)")
    known = list(transformers.CONFIG_MAPPING.keys())
    if raw["model_type"] not in known:
        near = difflib.get_close_matches(raw["model_type"], known, n=5, cutoff=0.5)
        raise InputError(f"hf:{path}: unknown model_type {raw['model_type']!r}"
                         + (f"; near: {', '.join(near)}" if near else ""))
    body = {k: v for k, v in raw.items() if k != "model_type"}
    try:
        config = transformers.AutoConfig.for_model(raw["model_type"], **body)
    except (TypeError, ValueError, KeyError) as exc:
        raise InputError(f"hf:{path}: not a valid {raw['model_type']} config ({str(exc).splitlines()[0]})") from None
    digest = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:6]
    stem = path.parent.name if path.stem == "config" and path.parent.name else path.stem
    return config, f"hf:{safe_key(stem)}-{digest}"


class HfWorkload(Workload):
    kind = "hf"

    def __init__(self, text: str, seq_len: int | None, cpu_defaults: bool) -> None:
        tf = _transformers()
        name = text.split(":", 1)[1]
        path = Path(name).expanduser()
        if name.endswith(".json") or os.sep in name or path.is_file():
            config, key = _from_file(path, tf)
            task, default_seq = _task_of(config, tf), 512
        elif name in PRESETS:
            cls, task, dims, default_seq = PRESETS[name]
            config, key = getattr(tf, cls)(**dims), f"hf:{name}"
        else:
            near = difflib.get_close_matches(name, list(PRESETS), n=4, cutoff=0.4)
            raise InputError(f"unknown hf preset {name!r}: " + (f"near: {', '.join(near)}; " if near else "")
                             + f"the presets are {', '.join(PRESETS)}, or give hf:path/to/config.json")
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        if seq_len is None:
            seq_len = 128 if cpu_defaults else default_seq
            seq_len = min(seq_len, limit) if limit else seq_len
        if seq_len < 1 or (limit and seq_len > limit):
            raise InputError(f"--seq-len {seq_len} does not fit {key}: it takes 1..{limit} tokens")
        super().__init__(text, key, seq_len=seq_len)
        # The loss the head computes, named, as transformers' LOSS_MAPPING does (unnamed, it warns).
        config.loss_type = "ForMaskedLM" if task == "masked" else "ForCausalLM"
        self.config, self.task, self.vocab = config, task, int(config.vocab_size)

    def default_batch(self, on_gpu: bool) -> int:
        return 8 if on_gpu else 2

    def _build(self, device, checkpointing: bool):
        import torch

        tf = _transformers()
        auto = auto_class(tf, "AutoModelForMaskedLM" if self.task == "masked" else "AutoModelForCausalLM")
        with torch.device(device):
            try:
                model = auto.from_config(self.config, attn_implementation="sdpa")
            except (ValueError, ImportError):  # an architecture without SDPA attention: its own
                model = auto.from_config(self.config)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model, checkpointing

    def batch(self, batch_size: int, device, generator=None):
        import torch

        ids = torch.randint(0, self.vocab, (batch_size, self.seq_len), device=device, generator=generator)
        if self.task == "causal":
            return {"input_ids": ids, "labels": ids}
        keep = torch.rand((batch_size, self.seq_len), device=device, generator=generator) < 0.15
        return {"input_ids": ids, "labels": torch.where(keep, ids, torch.full_like(ids, -100))}

    def loader(self, batch_size: int, *, num_workers: int = 2, preprocess_ms: float = 0.0, data_dir: str | None = None,
               seed: int = 0, samples: int = 4096, pin_memory: bool = False):
        from . import data

        tokens = max(1 << 20, 4 * batch_size * (self.seq_len + 1) * 64)
        path = data.token_file(data_dir or "/tmp", self.vocab, tokens, seed)
        return data.loader(data.TokenDataset(path, self.seq_len, preprocess_ms, samples, self.task), batch_size,
                           num_workers, pin_memory)

    def loss(self, model, batch):
        return model(**batch).loss

    def optimizer(self, model):
        from .base import adamw

        return adamw(model, lr=1e-4, weight_decay=0.01)

    def facts(self) -> dict:
        return {**super().facts(), "task": self.task, "model_type": self.config.model_type}


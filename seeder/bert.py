"""A plain-torch BERT sentence encoder (mean pooling), for MiniLM and other sentence-transformers BERTs.

sentence-transformers runs the same network, but importing it and ``transformers`` takes about 3.6 s on
a small CPU, which every Ray Data actor and every served replica pays before its first text, and its
``encode`` spends a few milliseconds of Python per call, which is most of a single question's encoding.
This module needs only ``torch``, ``tokenizers`` and ``safetensors`` (all already installed with
sentence-transformers) and reads the same files: ``config.json``, ``tokenizer.json`` and
``model.safetensors``. Its embeddings equal sentence-transformers' to float32 rounding
(``tests/test_bert.py``).

Texts are sorted by token count and batched so that each batch pads only to its own longest text;
the output keeps the input order.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def supports(path: str | Path) -> bool:
    """True for a sentence-transformers directory this module reproduces: a BERT with mean pooling."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text())
        modules = json.loads((path / "modules.json").read_text())
        pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    except (OSError, ValueError):
        return False
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
    mean_only = pooling.get("pooling_mode_mean_tokens") and not any(
        pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens",
                                 "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                                 "pooling_mode_lasttoken"))
    return (
        config.get("model_type") == "bert"
        and config.get("hidden_act") == "gelu"
        and config.get("position_embedding_type", "absolute") == "absolute"
        and kinds[:2] == ["Transformer", "Pooling"]
        and set(kinds[2:]) <= {"Normalize"}
        and bool(mean_only)
        and (path / "tokenizer.json").is_file()
        and (path / "model.safetensors").is_file()
    )


@functools.cache
def native_bfloat16() -> bool:
    """True when this CPU computes bfloat16 products natively (AVX512-BF16 or AMX-BF16 on Linux);
    elsewhere oneDNN emulates them, slower than float32."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


class BertSentenceEncoder:
    """Mean-pooled, L2-normalised BERT embeddings, the sentence-transformers way, in plain torch."""

    def __init__(self, path: str | Path, device: str = "cpu", half_precision: bool = True,
                 batch_size: int = 64, max_seq_length: int = 256, name: str | None = None,
                 cpu_precision: str = "float32"):
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.dtype = torch.float16 if half_precision else torch.float32
        else:
            self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cpu_precision]
        max_len = min(int(max_seq_length), int(config["max_position_embeddings"]))

        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_len)

        state = load_file(str(path / "model.safetensors"))
        prefix = "bert." if any(k.startswith("bert.") for k in state) else ""

        def w(name: str) -> torch.Tensor:
            return state[prefix + name].to(self.device, self.dtype)

        # Token type 0 everywhere (single sentences): fold its embedding into the position table.
        self.word = w("embeddings.word_embeddings.weight")
        self.position = w("embeddings.position_embeddings.weight") + w("embeddings.token_type_embeddings.weight")[0]
        self.emb_norm = (w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))
        self.blocks = []
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            # Q, K and V in one GEMM.
            qkv_w = torch.cat([w(p + f"attention.self.{n}.weight") for n in ("query", "key", "value")])
            qkv_b = torch.cat([w(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")])
            self.blocks.append((
                qkv_w, qkv_b,
                w(p + "attention.output.dense.weight"), w(p + "attention.output.dense.bias"),
                (w(p + "attention.output.LayerNorm.weight"), w(p + "attention.output.LayerNorm.bias")),
                w(p + "intermediate.dense.weight"), w(p + "intermediate.dense.bias"),
                w(p + "output.dense.weight"), w(p + "output.dense.bias"),
                (w(p + "output.LayerNorm.weight"), w(p + "output.LayerNorm.bias")),
            ))
        self.dim = int(self.word.shape[1])
        self.batch_size = int(batch_size)
        self.name = name or str(path)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Pooled embeddings of one padded batch: ids and mask are [B, L]."""
        batch, length = ids.shape
        hidden = F.embedding(ids, self.word) + self.position[:length]
        hidden = F.layer_norm(hidden, (self.dim,), *self.emb_norm, self.eps)
        # Padding keys are masked out; a fully padded row cannot occur (every text has [CLS] and [SEP]).
        attn_mask = mask[:, None, None, :].bool() if not bool(mask.all()) else None
        head_dim = self.dim // self.heads
        for qkv_w, qkv_b, out_w, out_b, norm1, in_w, in_b, ff_w, ff_b, norm2 in self.blocks:
            qkv = F.linear(hidden, qkv_w, qkv_b).view(batch, length, 3, self.heads, head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            ctx = ctx.transpose(1, 2).reshape(batch, length, self.dim)
            hidden = F.layer_norm(F.linear(ctx, out_w, out_b) + hidden, (self.dim,), *norm1, self.eps)
            inner = F.gelu(F.linear(hidden, in_w, in_b))
            hidden = F.layer_norm(F.linear(inner, ff_w, ff_b) + hidden, (self.dim,), *norm2, self.eps)
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1e-9)
        return F.normalize(pooled.float(), dim=-1)

    @torch.inference_mode()
    def encode(self, texts: list[str]) -> np.ndarray:
        texts = list(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=True)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        order = np.argsort(-lengths, kind="stable")
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            width = int(lengths[rows[0]])
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.arange(width)[None, :] < lengths[rows][:, None]
            ids[mask] = np.concatenate([encodings[r].ids for r in rows])
            pooled = self._forward(torch.from_numpy(ids).to(self.device),
                                   torch.from_numpy(mask).to(self.device))
            out[rows] = pooled.cpu().numpy()
        return out

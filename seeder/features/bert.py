"""A plain-torch BERT sentence encoder (mean pooling), for MiniLM and other sentence-transformers BERTs.

sentence-transformers runs the same network, but importing it and ``transformers`` takes seconds, which
every Ray Data actor and every served replica pays before its first text, and its ``encode`` spends
Python time on every call, which is most of a single question's encoding.
This module needs only ``torch``, ``tokenizers`` and ``safetensors`` (all already installed with
sentence-transformers) and reads the same files: ``config.json``, ``tokenizer.json`` and
``model.safetensors``. Its embeddings equal sentence-transformers' to float32 rounding
(``tests/features/test_bert.py``).

Texts are sorted by token count and batched so that each batch pads only to its own longest text;
the output keeps the input order.

On CPU, ``cpu_precision`` trades exactness for speed: ``bfloat16`` runs the network in bfloat16 (2x
with native support, cosine 0.9999 to float32); ``int8`` runs the four products of each layer as int8
GEMMs (weights per output row, activations per token: ``int8_linear``), faster still
(benchmarks/RESULTS.md), with embeddings within cosine ~0.997 of float32 (``tests/features/test_bert.py``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from seeder.config import CpuPrecision, choices


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
        pooling.get(k)
        for k in (
            "pooling_mode_cls_token",
            "pooling_mode_max_tokens",
            "pooling_mode_mean_sqrt_len_tokens",
            "pooling_mode_weightedmean_tokens",
            "pooling_mode_lasttoken",
        )
    )
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
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bfloat16() -> bool:
    """True when this CPU computes bfloat16 products natively (AVX512-BF16 or AMX-BF16 on Linux);
    elsewhere oneDNN emulates them, slower than float32."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def int8_linear(weight: torch.Tensor, bias: torch.Tensor):
    """``x -> x W^T + b`` as an int8 matrix product: the weights quantized once, symmetric per output
    row; the activations per call and per token (row), so a text's embedding does not depend on the
    other texts of its batch, as it would with one scale per batch (``torch.ao``'s dynamic
    quantization). ``torch._int_mm`` is PyTorch's int8 GEMM (int32 sums), rescaled to float32 by
    the two scales."""
    weight, bias = weight.float(), bias.float()
    weight_scale = (weight.abs().amax(1) / 127).clamp_min(1e-12)
    qweight_t = (weight / weight_scale[:, None]).round().to(torch.int8).t().contiguous()  # [in, out]
    out_features = weight.shape[0]

    def forward(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        scale = flat.abs().amax(1, keepdim=True).clamp_min(1e-8) / 127
        q = (flat / scale).round_().to(torch.int8)
        y = torch._int_mm(q, qweight_t).float().mul_(scale * weight_scale).add_(bias)
        return y.view(*x.shape[:-1], out_features)

    return forward


def plain_linear(weight: torch.Tensor, bias: torch.Tensor):
    return functools.partial(F.linear, weight=weight, bias=bias)


class Block(NamedTuple):
    """One transformer layer: its four products as callables (float or int8) and its two LayerNorms."""

    qkv: Callable[[torch.Tensor], torch.Tensor]
    out: Callable[[torch.Tensor], torch.Tensor]
    norm1: tuple[torch.Tensor, torch.Tensor]
    inner: Callable[[torch.Tensor], torch.Tensor]
    ffn: Callable[[torch.Tensor], torch.Tensor]
    norm2: tuple[torch.Tensor, torch.Tensor]


class BertSentenceEncoder:
    """Mean-pooled, L2-normalised BERT embeddings, the sentence-transformers way, in plain torch."""

    def __init__(
        self,
        path: str | Path,
        device: str = "cpu",
        half_precision: bool = True,
        batch_size: int = 64,
        max_seq_length: int = 256,
        name: str | None = None,
        cpu_precision: str = "float32",
    ):
        from safetensors.torch import load_file  # only when an encoder loads
        from tokenizers import Tokenizer  # only when an encoder loads

        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.device = torch.device(device)
        if cpu_precision not in choices(CpuPrecision):
            raise ValueError(f"cpu_precision={cpu_precision!r}: use one of {', '.join(choices(CpuPrecision))}")
        int8 = self.device.type == "cpu" and cpu_precision == "int8"
        if self.device.type == "cuda":
            self.dtype = torch.float16 if half_precision else torch.float32
        else:
            self.dtype = torch.bfloat16 if cpu_precision == "bfloat16" else torch.float32
        linear = int8_linear if int8 else plain_linear
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
            self.blocks.append(
                Block(
                    # Q, K and V in one GEMM.
                    qkv=linear(
                        torch.cat([w(p + f"attention.self.{n}.weight") for n in ("query", "key", "value")]),
                        torch.cat([w(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")]),
                    ),
                    out=linear(w(p + "attention.output.dense.weight"), w(p + "attention.output.dense.bias")),
                    norm1=(w(p + "attention.output.LayerNorm.weight"), w(p + "attention.output.LayerNorm.bias")),
                    inner=linear(w(p + "intermediate.dense.weight"), w(p + "intermediate.dense.bias")),
                    ffn=linear(w(p + "output.dense.weight"), w(p + "output.dense.bias")),
                    norm2=(w(p + "output.LayerNorm.weight"), w(p + "output.LayerNorm.bias")),
                )
            )
        self.dim = int(self.word.shape[1])
        self.batch_size = int(batch_size)
        self.name = name or str(path)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, padded: bool) -> torch.Tensor:
        """Pooled embeddings of one batch: ids and mask are [B, L]; ``padded``: whether any mask entry
        is 0 (the caller's to say, so the pass reads no tensor's value and compiles as one graph)."""
        batch, length = ids.shape
        hidden = F.embedding(ids, self.word) + self.position[:length]
        hidden = F.layer_norm(hidden, (self.dim,), *self.emb_norm, self.eps)
        # Padding keys are masked out; a fully padded row cannot occur (every text has [CLS] and [SEP]).
        attn_mask = mask[:, None, None, :].bool() if padded else None
        head_dim = self.dim // self.heads
        for block in self.blocks:
            qkv = block.qkv(hidden).view(batch, length, 3, self.heads, head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            ctx = ctx.transpose(1, 2).reshape(batch, length, self.dim)
            hidden = F.layer_norm(block.out(ctx) + hidden, (self.dim,), *block.norm1, self.eps)
            inner = F.gelu(block.inner(hidden))
            hidden = F.layer_norm(block.ffn(inner) + hidden, (self.dim,), *block.norm2, self.eps)
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
            rows = order[start : start + self.batch_size]
            width = int(lengths[rows[0]])
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.arange(width)[None, :] < lengths[rows][:, None]
            ids[mask] = np.concatenate([encodings[r].ids for r in rows])
            pooled = self._forward(
                torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device), not bool(mask.all())
            )
            out[rows] = pooled.cpu().numpy()
        return out

"""seeder.features.bert: the plain-torch BERT encoder gives sentence-transformers' embeddings, and is chosen only
for models it reproduces."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from seeder.config import ConfigError, EmbedConfig
from seeder.features import bert
from seeder.features.embed import SentenceTransformerEncoder, load_encoder, minilm_path, runs_plain_torch

TEXTS = [
    "what languages are the films directed by Joel Zwick in",
    "",
    "Ünïcödé café naïve 東京 — ½",
    "word " * 400,  # longer than max_seq_length: truncated the same way
    "The Mummy",
    "[Ginger Rogers] starred in which movies",
] + [f"entity {i} with a name of {'many ' * (i % 9)}words" for i in range(70)]
SHORT_TEXTS = [t for t in TEXTS if len(t) < 1000]
"""``TEXTS`` without the one past max_seq_length, for the bfloat16 and int8 checks: its truncation is the
float32 test's, and its batch, padded to max_seq_length, was most of their time on CPUs without native
bfloat16 or int8 products."""


@pytest.fixture(scope="module")
def encoders():
    path = minilm_path()
    return bert.BertSentenceEncoder(path, batch_size=16), SentenceTransformerEncoder(path, device="cpu", batch_size=16)


def test_embeddings_equal_sentence_transformers(encoders):
    ours, reference = encoders
    got, want = ours.encode(TEXTS), reference.encode(TEXTS)
    assert got.shape == want.shape == (len(TEXTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-6)


def test_order_kept_and_batching_does_not_matter(encoders):
    ours, _ = encoders
    whole = ours.encode(TEXTS)
    one_by_one = np.concatenate([ours.encode([t]) for t in TEXTS[:12]])
    np.testing.assert_allclose(whole[:12], one_by_one, atol=2e-6)
    reversed_rows = ours.encode(TEXTS[::-1])[::-1]
    np.testing.assert_allclose(whole, reversed_rows, atol=2e-6)
    assert ours.encode([]).shape == (0, 384)


def _model_copy(tmp_path, pooling: dict | None = None):
    source = minilm_path()
    copy = tmp_path / "model"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("model.safetensors"))
    (copy / "model.safetensors").symlink_to(source / "model.safetensors")
    if pooling is not None:
        config = json.loads((copy / "1_Pooling" / "config.json").read_text())
        config.update(pooling)
        (copy / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return copy


def test_load_encoder_picks_the_backend(tmp_path):
    assert isinstance(load_encoder(EmbedConfig(encoder="minilm"), device="cpu"), bert.BertSentenceEncoder)
    forced = load_encoder(EmbedConfig(encoder="minilm", backend="sentence-transformers"), device="cpu")
    assert isinstance(forced, SentenceTransformerEncoder)

    # CLS pooling is not what seeder.features.bert computes: auto falls back, torch refuses with the reason.
    cls_model = _model_copy(tmp_path, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    assert bert.supports(_model_copy(tmp_path / "same")) and not bert.supports(cls_model)
    assert isinstance(load_encoder(EmbedConfig(encoder=str(cls_model)), device="cpu"), SentenceTransformerEncoder)
    with pytest.raises(ConfigError, match="embed.backend=torch runs mean-pooled BERT models only"):
        load_encoder(EmbedConfig(encoder=str(cls_model), backend="torch"), device="cpu")

    # A retriever's encoder_precision=auto asks the same question, so it never picks bfloat16 for a
    # model the plain-torch backend does not run (loading would then fail).
    from seeder.serving.retriever import resolve_encoder_precision

    assert runs_plain_torch(EmbedConfig(encoder="minilm")) and not runs_plain_torch(EmbedConfig(encoder=str(cls_model)))
    assert not runs_plain_torch(EmbedConfig(encoder="minilm", backend="sentence-transformers"))
    assert resolve_encoder_precision("auto", EmbedConfig(encoder=str(cls_model))) == "float32"


def test_bfloat16_on_cpu_stays_close_to_float32(encoders):
    """``embed.cpu_precision=bfloat16``: the same network in bfloat16 (2x faster with native support);
    the embeddings stay unit float32 vectors within cosine 0.999 of float32's."""
    ours, _ = encoders
    half = bert.BertSentenceEncoder(minilm_path(), batch_size=16, cpu_precision="bfloat16")
    got, want = half.encode(SHORT_TEXTS), ours.encode(SHORT_TEXTS)
    assert got.dtype == np.float32 and np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    cosine = (got * want).sum(1)
    assert cosine.min() > 0.999 and not np.array_equal(got, want)
    assert isinstance(load_encoder(EmbedConfig(cpu_precision="bfloat16"), device="cpu"), bert.BertSentenceEncoder)
    with pytest.raises(ConfigError, match="cpu_precision=bfloat16 needs the plain-torch backend"):
        load_encoder(EmbedConfig(cpu_precision="bfloat16", backend="sentence-transformers"), device="cpu")


def test_int8_on_cpu_stays_close_to_float32_and_ignores_its_batch(encoders):
    """``embed.cpu_precision=int8``: int8 GEMMs with a scale per token, so a text's embedding is the
    same alone as in a batch (up to a rounding flip of one 8-bit step), within cosine 0.98 of float32's."""
    ours, _ = encoders
    quantized = bert.BertSentenceEncoder(minilm_path(), batch_size=16, cpu_precision="int8")
    got, want = quantized.encode(SHORT_TEXTS), ours.encode(SHORT_TEXTS)
    assert got.dtype == np.float32 and np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    cosine = (got * want).sum(1)
    assert cosine.min() > 0.98 and np.median(cosine) > 0.995 and not np.array_equal(got, want)
    alone = np.concatenate([quantized.encode([t]) for t in SHORT_TEXTS[:8]])
    assert np.abs(alone - got[:8]).max() < 1e-2
    # A product of the layer equals the float one to the two quantization steps.
    weight, bias = torch.randn(48, 32), torch.randn(48)
    x = torch.randn(2, 5, 32)
    exact = torch.nn.functional.linear(x, weight, bias)
    approx = bert.int8_linear(weight, bias)(x)
    assert approx.shape == exact.shape and (approx - exact).abs().max() < 0.05 * exact.abs().max()
    with pytest.raises(ConfigError, match="cpu_precision=int8 needs the plain-torch backend"):
        load_encoder(EmbedConfig(cpu_precision="int8", backend="sentence-transformers"), device="cpu")


def test_cpu_precision_is_fingerprinted_only_when_not_float32():
    from seeder.config import SeederConfig
    from seeder.preprocessing.stages import stage_fingerprints

    def embed_fingerprint(**embed) -> str:
        config = SeederConfig()
        for key, value in embed.items():
            setattr(config.embed, key, value)
        return stage_fingerprints(config, "dataset")["embed"]

    assert embed_fingerprint(cpu_precision="bfloat16") != embed_fingerprint()
    assert embed_fingerprint(cpu_precision="int8") not in (embed_fingerprint(), embed_fingerprint(cpu_precision="bfloat16"))
    assert embed_fingerprint(backend="sentence-transformers") == embed_fingerprint()  # same numbers
    # The hashing encoder has no precision to choose.
    assert embed_fingerprint(encoder="hash", cpu_precision="bfloat16") == embed_fingerprint(encoder="hash")

"""Encoders and PCA (seeder.features.embed)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from seeder.config import ConfigError, EmbedConfig
from seeder.features.embed import PCA, HashEncoder, apply_pca, check_encoder, fit_pca, hash_features, load_encoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# -- hashing encoder ---------------------------------------------------------------------------------


def test_hash_encoder_is_deterministic_normalised_and_order_independent():
    texts = ["The Matrix (1999)", "directed by Lana Wachowski", "what films did [Keanu Reeves] act in"]
    first = HashEncoder(dim=96).encode(texts)
    again = HashEncoder(dim=96).encode(list(reversed(texts)))[::-1]
    assert first.shape == (3, 96) and first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(first, again)  # a row depends on its text only, not on the batch


def test_hash_encoder_similarity_follows_shared_words():
    enc = HashEncoder(dim=384)
    a, b, c = enc.encode(["keanu reeves movies", "Keanu Reeves", "release year of Titanic"])
    assert a @ b > 0.4  # shares two words and their trigrams (case-insensitive)
    assert a @ b > a @ c + 0.3
    assert abs(a @ c) < 0.3


def test_hash_features_never_cross_text_boundaries():
    rows, buckets = hash_features(["ab", "cd"])
    # " ab " has trigrams " ab", "ab " and one word; the same for " cd ": 3 features each.
    assert np.bincount(rows).tolist() == [3, 3]
    solo_rows, solo_buckets = hash_features(["cd"])
    np.testing.assert_array_equal(np.sort(buckets[rows == 1]), np.sort(solo_buckets))


def test_hash_encoder_via_load_encoder_and_bad_encoder_name(tmp_path):
    enc = load_encoder(EmbedConfig(encoder="hash", hash_dim=48))
    assert enc.encode(["x y z"]).shape == (1, 48)
    with pytest.raises(ConfigError, match="neither 'minilm', 'hash' nor a local sentence-transformers"):
        check_encoder(EmbedConfig(encoder=str(tmp_path / "no-such-model")))


# -- MiniLM, offline ---------------------------------------------------------------------------------


def test_minilm_loads_offline_and_gives_384d_unit_vectors():
    enc = load_encoder(EmbedConfig(encoder="minilm"), device="cpu")
    vectors = enc.encode(["Tom Hanks", "the actor Tom Hanks", "a recipe for onion soup"])
    assert vectors.shape == (3, 384) and enc.dim == 384
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-4)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    assert enc.batch_size == EmbedConfig().batch_size  # the CPU's pass size


def test_a_gpu_encoder_runs_larger_passes_than_a_cpu_one():
    from seeder.features.embed import encoder_batch_size

    config = EmbedConfig(batch_size=32, gpu_batch_size=256)
    assert encoder_batch_size(config, "cpu") == 32
    assert encoder_batch_size(config, "cuda") == encoder_batch_size(config, "cuda:1") == 256


# -- PCA (Appendix D.1) --------------------------------------------------------------------------------


def _low_rank(n: int = 2000, d: int = 40, rank: int = 5, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((d, rank)))[0].T  # [rank, d], orthonormal
    return (rng.standard_normal((n, rank)) * np.arange(rank, 0, -1) * 3) @ basis + rng.standard_normal(d) * 0.5


def test_pca_components_are_orthonormal_and_sorted_by_variance():
    x = _low_rank()
    pca = fit_pca(x, 8, sample=1500, seed=0)
    assert pca.components.shape == (8, 40) and pca.mean.shape == (40,)
    np.testing.assert_allclose(pca.components @ pca.components.T, np.eye(8), atol=1e-5)
    assert np.all(np.diff(pca.explained_variance) <= 1e-6)


def test_pca_reconstructs_low_rank_data_and_apply_normalises():
    x = _low_rank()
    pca = fit_pca(x, 5, sample=len(x))
    projected = (x - pca.mean) @ pca.components.T
    rebuilt = projected @ pca.components + pca.mean
    np.testing.assert_allclose(rebuilt, x, atol=1e-3)
    reduced = apply_pca(x, pca, block_rows=333)  # several blocks
    assert reduced.shape == (2000, 5) and reduced.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(reduced, axis=1), 1.0, rtol=1e-5)
    expected = projected / np.linalg.norm(projected, axis=1, keepdims=True)
    np.testing.assert_allclose(reduced, expected, atol=1e-4)


def test_pca_is_deterministic_and_round_trips(tmp_path):
    x = _low_rank()
    a, b = fit_pca(x, 6, sample=500, seed=3), fit_pca(x, 6, sample=500, seed=3)
    np.testing.assert_array_equal(a.components, b.components)
    a.save(tmp_path / "pca.npz")
    c = PCA.load(tmp_path / "pca.npz")
    np.testing.assert_array_equal(a.components, c.components)
    np.testing.assert_array_equal(a.mean, c.mean)


def test_pca_rejects_a_dimension_above_the_input_width():
    with pytest.raises(ConfigError, match="reduce.dim=50 must be between 1 and the embedding width 40"):
        fit_pca(_low_rank(), 50)


def test_apply_without_pca_only_normalises():
    x = np.array([[3.0, 4.0], [0.0, 2.0]], dtype=np.float32)
    np.testing.assert_allclose(apply_pca(x, None), [[0.6, 0.8], [0.0, 1.0]])

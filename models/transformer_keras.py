"""The transformers in Keras 3 (keras.ops only, so they build under the jax, torch and
tensorflow backends): GPT-2 and ViT as models/transformer.py's TransformerShape describes them.
models/gpt2/keras_builder.py and models/vit_b16/keras_builder.py call these (their tiny
versions import those); the parameter count equals the spec's (tests/test_keras_transformers.py).

Attention is keras.layers.MultiHeadAttention (query, key, value and output kernels, each with a
bias: 4 d^2 + 4 d, the count of a fused qkv and an output projection), causal for GPT
(use_causal_mask=True). The LM head is the token embedding used backwards (TiedEmbedding,
one matrix, no bias). Every kernel and embedding starts normal(0.02), biases zero. Under
mixed_bfloat16 the blocks compute in bfloat16 and the logits come out float32 (a float32
linear activation, as the CNN builders' float32 softmax), so the loss reads float32 logits.

Imports keras: never import this module from the parent process.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import layers, ops

from models import ModelSpec
from models.keras_common import input_layer


def init() -> keras.initializers.Initializer:
    return keras.initializers.RandomNormal(stddev=0.02)


@keras.saving.register_keras_serializable(package="mgbench")
class TiedEmbedding(layers.Embedding):
    """Token embedding that is also the LM head: called on token ids it looks them up; called
    with reverse=True on (B, T, d) it multiplies by its matrix transposed (logits, no bias).
    One layer called twice, so its matrix is one weight (counted once)."""

    def call(self, inputs: Any, reverse: bool = False) -> Any:
        if not reverse:
            return super().call(inputs)
        matrix = ops.cast(self.embeddings, self.compute_dtype)
        return ops.matmul(ops.cast(inputs, self.compute_dtype), ops.transpose(matrix))

    def compute_output_spec(self, inputs: Any, reverse: bool = False) -> Any:
        if not reverse:
            return super().compute_output_spec(inputs)
        return keras.KerasTensor((*inputs.shape[:-1], self.input_dim), dtype=self.compute_dtype)


@keras.saving.register_keras_serializable(package="mgbench")
class PositionEmbedding(layers.Layer):
    """A learned (sequence, d) position weight added to its (B, sequence, d) input."""

    def build(self, input_shape: Any) -> None:
        self.positions = self.add_weight(shape=tuple(input_shape[1:]), initializer=init(),
                                         name="positions")

    def call(self, inputs: Any) -> Any:
        return inputs + ops.cast(self.positions, inputs.dtype)[None]


@keras.saving.register_keras_serializable(package="mgbench")
class ClassToken(layers.Layer):
    """A learned (d,) class token put before the patches: (B, P, d) -> (B, P + 1, d)."""

    def build(self, input_shape: Any) -> None:
        self.token = self.add_weight(shape=(input_shape[-1],), initializer=init(),
                                     name="token")

    def call(self, inputs: Any) -> Any:
        token = ops.cast(self.token, inputs.dtype)[None, None, :]
        token = ops.broadcast_to(token, (ops.shape(inputs)[0], 1, inputs.shape[-1]))
        return ops.concatenate([token, inputs], axis=1)

    def compute_output_shape(self, input_shape: Any) -> Any:
        seq = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], seq, input_shape[2])


@keras.saving.register_keras_serializable(package="mgbench")
class Gelu(layers.Layer):
    """GELU, the tanh approximation (GPT-2) or exact (ViT)."""

    def __init__(self, approximate: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.approximate = approximate

    def call(self, inputs: Any) -> Any:
        return keras.activations.gelu(inputs, approximate=self.approximate)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "approximate": self.approximate}


@keras.saving.register_keras_serializable(package="mgbench")
class FirstToken(layers.Layer):
    """(B, S, d) -> (B, d): the class token's output."""

    def call(self, inputs: Any) -> Any:
        return inputs[:, 0]

    def compute_output_shape(self, input_shape: Any) -> Any:
        return (input_shape[0], input_shape[2])


def block(x: Any, shape: Any, epsilon: float, causal: bool, approximate: bool,
          name: str) -> Any:
    """One pre-LayerNorm block: x + attention(LN(x)), then x + MLP(LN(x))."""
    d = shape.d_model
    h = layers.LayerNormalization(epsilon=epsilon, name=f"{name}_ln1")(x)
    h = layers.MultiHeadAttention(shape.heads, shape.head_dim, kernel_initializer=init(),
                                  name=f"{name}_attn")(h, h, use_causal_mask=causal)
    x = layers.Add(name=f"{name}_add1")([x, h])
    h = layers.LayerNormalization(epsilon=epsilon, name=f"{name}_ln2")(x)
    h = layers.Dense(shape.mlp_dim, kernel_initializer=init(), name=f"{name}_fc1")(h)
    h = Gelu(approximate, name=f"{name}_gelu")(h)
    h = layers.Dense(d, kernel_initializer=init(), name=f"{name}_fc2")(h)
    return layers.Add(name=f"{name}_add2")([x, h])


def build_gpt(spec: ModelSpec) -> keras.Model:
    """GPT-2: int token ids (B, seq_len) in, float32 next-token logits (B, seq_len, vocab)."""
    shape = spec.transformer
    tokens = keras.Input((shape.seq_len,), dtype="int32", name="tokens")
    embedding = TiedEmbedding(shape.vocab, shape.d_model, embeddings_initializer=init(),
                              name="wte")
    x = PositionEmbedding(name="wpe")(embedding(tokens))
    for i in range(shape.layers):
        x = block(x, shape, 1e-5, causal=True, approximate=True, name=f"h{i}")
    x = layers.LayerNormalization(epsilon=1e-5, name="ln_f")(x)
    logits = embedding(x, reverse=True)
    logits = layers.Activation("linear", dtype="float32", name="logits")(logits)
    return keras.Model(tokens, logits, name=spec.name)


def build_vit(spec: ModelSpec, data_format: str = "channels_last") -> keras.Model:
    """ViT: an image (data_format's layout) in, float32 class logits (B, classes) out."""
    shape = spec.transformer
    d = shape.d_model
    image = input_layer(spec.input_shape, data_format)
    x = layers.Conv2D(d, shape.patch, strides=shape.patch, data_format=data_format,
                      kernel_initializer=init(), name="patch_embed")(image)
    if data_format == "channels_first":
        x = layers.Permute((2, 3, 1), name="to_channels_last")(x)
    x = layers.Reshape((shape.patches, d), name="patches")(x)
    x = ClassToken(name="cls")(x)
    x = PositionEmbedding(name="pos_embed")(x)
    for i in range(shape.layers):
        x = block(x, shape, 1e-6, causal=False, approximate=False, name=f"block{i}")
    x = layers.LayerNormalization(epsilon=1e-6, name="ln_f")(x)
    x = FirstToken(name="cls_out")(x)
    x = layers.Dense(shape.classes, kernel_initializer=init(), name="head")(x)
    logits = layers.Activation("linear", dtype="float32", name="logits")(x)
    return keras.Model(image, logits, name=spec.name)

"""The transformer workloads in Flax (linen), as models/transformer.py describes them: GPT-2
(token ids in, next-token logits (B, T, V) out, causal attention, LM head tied to the token
embedding through nn.Embed.attend) and ViT (NHWC images in, a patch x patch stride-patch Conv to
d_model, a class token, learned positions, a Dense head on the class token). Pre-LayerNorm blocks:
fused q/k/v Dense(3d) and an output Dense(d), both with bias; an MLP d -> mlp_dim -> d; GELU tanh
(gpt) or exact (vit); LayerNorm eps 1e-5 (gpt) or 1e-6 (vit); every weight initialised
normal(0.02), biases zero, LayerNorm scale 1. No dropout, no BatchNorm: the models have only a
"params" collection. models/gpt2/flax_builder.py and models/vit_b16/flax_builder.py build them
(the tiny ones import those builders).

`dtype` is the computation dtype (None: float32 from the params; jnp.bfloat16: bfloat16 compute,
float32 params; LayerNorm's statistics and attention's softmax stay in float32, as Flax and
jax.nn.dot_product_attention compute them). `attention` is jax.nn.dot_product_attention's
`implementation` (None: JAX chooses, which is XLA's own ops in jax 0.10.2; "xla"; "cudnn": cuDNN's
fused flash attention, GPUs and bf16 only): jax_native's `attention` option; every other caller
leaves it None. Imports jax and flax: child processes only.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.transformer import TransformerShape

INIT = nn.initializers.normal(0.02)


class Block(nn.Module):
    """LN -> self-attention (fused qkv, out projection) -> residual; LN -> MLP -> residual."""

    shape: TransformerShape
    causal: bool
    dtype: Any = None
    attention: str | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        s = self.shape
        eps = 1e-5 if s.kind == "gpt" else 1e-6
        b, t, d = x.shape
        h = nn.LayerNorm(epsilon=eps, dtype=self.dtype, name="ln_1")(x)
        qkv = nn.Dense(3 * d, kernel_init=INIT, dtype=self.dtype, name="qkv")(h)
        q, k, v = (a.reshape(b, t, s.heads, s.head_dim) for a in jnp.split(qkv, 3, axis=-1))
        h = jax.nn.dot_product_attention(q, k, v, is_causal=self.causal,
                                         implementation=self.attention).reshape(b, t, d)
        x = x + nn.Dense(d, kernel_init=INIT, dtype=self.dtype, name="proj")(h)
        h = nn.LayerNorm(epsilon=eps, dtype=self.dtype, name="ln_2")(x)
        h = nn.Dense(s.mlp_dim, kernel_init=INIT, dtype=self.dtype, name="fc")(h)
        h = nn.gelu(h, approximate=s.kind == "gpt")
        return x + nn.Dense(d, kernel_init=INIT, dtype=self.dtype, name="fc_out")(h)


class GPT(nn.Module):
    """Token and position embeddings, causal blocks, final LayerNorm, tied LM head (no bias).
    `train` is accepted (and unused: no dropout) so runners call it as they call the CNNs."""

    shape: TransformerShape
    dtype: Any = None
    attention: str | None = None

    @nn.compact
    def __call__(self, ids: jax.Array, train: bool = False) -> jax.Array:
        s = self.shape
        wte = nn.Embed(s.vocab, s.d_model, embedding_init=INIT, dtype=self.dtype, name="wte")
        wpe = nn.Embed(s.seq_len, s.d_model, embedding_init=INIT, dtype=self.dtype, name="wpe")
        x = wte(ids) + wpe(jnp.arange(ids.shape[1]))[None]
        for i in range(s.layers):
            x = Block(s, True, self.dtype, self.attention, name=f"h_{i}")(x)
        x = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype, name="ln_f")(x)
        return wte.attend(x)


class ViT(nn.Module):
    """Patch Conv (bias), class token, learned positions, encoder blocks, final LayerNorm,
    Dense head (bias) on the class token."""

    shape: TransformerShape
    dtype: Any = None
    attention: str | None = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        s = self.shape
        p = s.patch
        x = nn.Conv(s.d_model, (p, p), strides=(p, p), padding="VALID", kernel_init=INIT,
                    dtype=self.dtype, name="patch_embed")(x)
        b = x.shape[0]
        x = x.reshape(b, -1, s.d_model)
        cls = self.param("cls_token", INIT, (1, 1, s.d_model))
        pos = self.param("pos_embed", INIT, (1, s.sequence, s.d_model))
        x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, s.d_model)).astype(x.dtype), x],
                            axis=1)
        x = x + pos.astype(x.dtype)
        for i in range(s.layers):
            x = Block(s, False, self.dtype, self.attention, name=f"block_{i}")(x)
        x = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name="ln_f")(x)
        return nn.Dense(s.classes, kernel_init=INIT, dtype=self.dtype, name="head")(x[:, 0])


def build_transformer(shape: TransformerShape, data_format: str = "channels_last",
                      dtype: Any = None, attention: str | None = None) -> nn.Module:
    """The GPT or ViT of a TransformerShape; data_format must be channels_last (ViT's NHWC
    images; a GPT takes token ids and ignores the layout but is held to the same rule);
    `attention` jax.nn.dot_product_attention's implementation (None: JAX's choice)."""
    from models.flax_common import check_data_format

    check_data_format(data_format)
    if shape.kind == "gpt":
        return GPT(shape, dtype=dtype, attention=attention)
    if shape.kind == "vit":
        return ViT(shape, dtype=dtype, attention=attention)
    raise ValueError(f"unknown transformer kind {shape.kind!r}")

"""The transformer workloads' dimensions and their standard counts, framework-free: GPT-2
(decoder, learned positions, tied embeddings) and ViT (encoder over image patches). Every
framework's builder follows these shapes; tests/test_model_parity.py holds them to the count.

Parameters count every weight and bias. FLOPs follow the standard count (PaLM, appendix B;
torchtitan's `num_flops_per_token`): a training step costs 6 FLOPs per matmul parameter per
token plus 12 x layers x d_model x sequence for attention's QK^T and AV (full, unmasked
sequence), i.e. a forward pass is a third: 2 per matmul parameter per token plus
4 x layers x d x sequence. Matmul parameters are the blocks' projections and the output head
(the tied embedding matrix used as the LM head counts, the embedding lookups do not);
biases, LayerNorm, softmax and GELU are left out, as the standard count leaves them.
"""

from __future__ import annotations

from dataclasses import dataclass

from models import ModelSpec

STANDARD_COUNT = ("standard count: 2 x matmul parameters + 4 x layers x d_model x sequence per "
                  "token, forward (PaLM appendix B; 6N + 12LdT per token for training)")


@dataclass(frozen=True)
class TransformerShape:
    """A pre-LayerNorm transformer: `layers` blocks of multi-head self-attention (`heads`,
    fused q/k/v and an output projection, all with bias) and an MLP d -> mlp_dim -> d (GELU),
    a LayerNorm before each and a final one.

    kind "gpt": token embedding (vocab x d) + learned positions (seq_len x d), causal
    attention, final LayerNorm, LM head tied to the token embedding (no bias), GELU tanh
    approximation, LayerNorm eps 1e-5, inputs `seq_len` token ids.
    kind "vit": a patch x patch stride-patch convolution (with bias) to d, a class token,
    learned positions (patches + 1), final LayerNorm, a linear head (with bias) on the class
    token, exact GELU, LayerNorm eps 1e-6, inputs image x image x channels."""

    kind: str  # "gpt" | "vit"
    layers: int
    d_model: int
    heads: int
    mlp_dim: int
    seq_len: int = 0  # gpt: the context; vit: derived (patches + class token)
    vocab: int = 0  # gpt
    image: int = 0  # vit: square image side
    patch: int = 0  # vit
    channels: int = 3  # vit
    classes: int = 0  # vit

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")
        if self.kind == "vit" and self.image % self.patch:
            raise ValueError(f"image {self.image} is not a multiple of patch {self.patch}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def patches(self) -> int:
        return (self.image // self.patch) ** 2 if self.kind == "vit" else 0

    @property
    def sequence(self) -> int:
        """Tokens the blocks see per sample: the context, or the patches and the class token."""
        return self.patches + 1 if self.kind == "vit" else self.seq_len

    def block_params(self) -> int:
        d, m = self.d_model, self.mlp_dim
        attention = 3 * d * d + 3 * d + d * d + d
        mlp = d * m + m + m * d + d
        return attention + mlp + 2 * (2 * d)  # two LayerNorms (scale, bias)

    def params(self) -> int:
        d, blocks = self.d_model, self.layers * self.block_params()
        if self.kind == "gpt":
            return self.vocab * d + self.seq_len * d + blocks + 2 * d
        patch_embed = self.patch * self.patch * self.channels * d + d
        return (patch_embed + d + self.sequence * d + blocks + 2 * d
                + d * self.classes + self.classes)

    def block_matmul_params(self) -> int:
        return self.layers * (4 * self.d_model ** 2 + 2 * self.d_model * self.mlp_dim)

    def forward_flops_per_sample(self) -> int:
        """Forward FLOPs of one sample by the standard count (module docstring)."""
        d, t, layers = self.d_model, self.sequence, self.layers
        attention = 4 * layers * d * t * t
        if self.kind == "gpt":
            return 2 * (self.block_matmul_params() + d * self.vocab) * t + attention
        patch_embed = 2 * self.patch * self.patch * self.channels * d * self.patches
        head = 2 * d * self.classes  # the class token only
        return 2 * self.block_matmul_params() * t + attention + patch_embed + head

    def training_flops_per_token(self) -> int:
        """6N + 12 L d T for a GPT (the figure torchtitan reports per token)."""
        return 3 * self.forward_flops_per_sample() // self.sequence


def transformer_spec(name: str, shape: TransformerShape, description: str,
                     published_params: int | None = None) -> ModelSpec:
    """The ModelSpec of a transformer of `shape`: token ids in for a gpt, an image for a vit;
    parameters and FLOPs by this module's count (ValueError if `published_params`, the
    reference implementation's count, disagrees)."""
    params = shape.params()
    if published_params is not None and params != published_params:
        raise ValueError(f"{name}: {params:,} parameters by the count, {published_params:,} "
                         "published")
    gpt = shape.kind == "gpt"
    return ModelSpec(
        name=name,
        input_shape=(shape.seq_len,) if gpt else (shape.image, shape.image, shape.channels),
        num_classes=shape.vocab if gpt else shape.classes,
        params=params, trainable_params=params,
        flops_per_sample=shape.forward_flops_per_sample(),
        description=description,
        input_kind="tokens" if gpt else "image",
        workload="transformer",
        flops_source=STANDARD_COUNT,
        transformer=shape,
    )

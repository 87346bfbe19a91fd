"""The transformer workloads in PyTorch (models/transformer.py's TransformerShape): GPT-2 (gpt2,
gpt2_tiny) and ViT (vit_b16, vit_tiny), one implementation each, as nanoGPT and timm write
them: pre-LayerNorm blocks of fused-qkv multi-head attention (torch's
scaled_dot_product_attention, causal for GPT) and a GELU MLP, all projections with bias;
weights initialised normal(0.02), biases zero, LayerNorms one and zero. No dropout.

GPT: token and learned position embeddings, final LayerNorm, the LM head tied to the token
embedding (no bias), GELU tanh, LayerNorm eps 1e-5; int token ids (batch, seq) in, logits
(batch, seq, vocab) out. ViT: a patch x patch convolution with stride patch, a class token,
learned positions, final LayerNorm, a linear head on the class token, exact GELU, LayerNorm
eps 1e-6; NCHW images in (either memory format), logits (batch, classes) out.

Imports torch: child processes only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models import ModelSpec
from models.torch_common import apply_data_format, check_data_format
from models.transformer import TransformerShape


class SelfAttention(nn.Module):
    """Multi-head self-attention: fused q/k/v projection, scaled dot-product attention, output
    projection (both with bias)."""

    def __init__(self, shape: TransformerShape, causal: bool) -> None:
        super().__init__()
        d = shape.d_model
        self.heads, self.causal = shape.heads, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """x + attn(ln_1(x)), then x + mlp(ln_2(x)): the pre-LayerNorm transformer block."""

    def __init__(self, shape: TransformerShape, causal: bool, eps: float, gelu: str) -> None:
        super().__init__()
        d, m = shape.d_model, shape.mlp_dim
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.attn = SelfAttention(shape, causal)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(d, m), nn.GELU(approximate=gelu), nn.Linear(m, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def init_weights(model: nn.Module) -> None:
    """normal(0.02) weights and embeddings, zero biases, LayerNorm scale one and bias zero."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def check_kind(shape: TransformerShape, kind: str, model: str) -> None:
    """ValueError unless shape is of `kind` ("gpt" | "vit"), the one `model` builds."""
    if shape.kind != kind:
        raise ValueError(f"{model} needs a {kind} TransformerShape, not {shape.kind!r}")


def blocks_of(shape: TransformerShape, causal: bool, eps: float, gelu: str) -> nn.ModuleList:
    """shape.layers pre-LayerNorm blocks."""
    return nn.ModuleList(Block(shape, causal, eps, gelu) for _ in range(shape.layers))


class GPT(nn.Module):
    """GPT-2: token ids (batch, seq) in, next-token logits (batch, seq, vocab) out."""

    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        check_kind(shape, "gpt", "GPT")
        d = shape.d_model
        self.wte = nn.Embedding(shape.vocab, d)
        self.wpe = nn.Embedding(shape.seq_len, d)
        self.blocks = blocks_of(shape, True, 1e-5, "tanh")
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        self.register_buffer("positions", torch.arange(shape.seq_len), persistent=False)
        init_weights(self)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(self.positions[:ids.shape[1]])
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the head tied to the embedding


class ViT(nn.Module):
    """ViT: NCHW images in, class logits (batch, classes) out (from the class token)."""

    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        check_kind(shape, "vit", "ViT")
        d = shape.d_model
        self.patch_embed = nn.Conv2d(shape.channels, d, shape.patch, stride=shape.patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.zeros(1, shape.sequence, d))
        self.blocks = blocks_of(shape, False, 1e-6, "none")
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, shape.classes)
        init_weights(self)
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (batch, patches, d)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def build_gpt(spec: ModelSpec, data_format: str = "channels_first") -> nn.Module:
    """GPT-2 of spec.transformer; data_format is accepted (the runners pass it) and has
    nothing to lay out."""
    check_data_format(data_format)
    return GPT(spec.transformer)


def build_vit(spec: ModelSpec, data_format: str = "channels_first") -> nn.Module:
    """ViT of spec.transformer, its patch convolution in data_format's memory format."""
    check_data_format(data_format)
    return apply_data_format(ViT(spec.transformer), data_format)

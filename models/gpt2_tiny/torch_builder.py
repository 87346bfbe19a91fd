"""GPT-2 at toy size in PyTorch: gpt2's builder."""

from models.gpt2.torch_builder import build

__all__ = ["build"]

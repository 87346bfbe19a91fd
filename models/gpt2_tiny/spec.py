"""GPT-2's code at toy size: two layers, d 128, a 2,048-token vocabulary, context 64 (a CPU
step well under a second), for tests and smoke sweeps."""

from models.transformer import TransformerShape, transformer_spec

SHAPE = TransformerShape("gpt", layers=2, d_model=128, heads=4, mlp_dim=512, seq_len=64,
                         vocab=2_048)

SPEC = transformer_spec(  # 667,136 parameters
    "gpt2_tiny", SHAPE, "GPT-2 at toy size: 2 layers, d 128, 4 heads, context 64, vocab 2,048, "
    "tied embeddings")

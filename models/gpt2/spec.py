"""GPT-2 small (124M; Radford et al. 2019, as nanoGPT writes it): the transformer of the
tokens/sec figures."""

from models.transformer import TransformerShape, transformer_spec

SHAPE = TransformerShape("gpt", layers=12, d_model=768, heads=12, mlp_dim=3072, seq_len=1024,
                         vocab=50_257)

SPEC = transformer_spec(
    "gpt2", SHAPE, "GPT-2 small: 12 layers, d 768, 12 heads, context 1024, vocab 50,257, tied "
    "embeddings",
    published_params=124_439_808)  # Hugging Face's GPT2LMHeadModel (tied head), biases included

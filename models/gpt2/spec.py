"""GPT-2 small (124M; Radford et al. 2019, as nanoGPT writes it): the transformer of the
tokens/sec figures."""

from models import ModelSpec
from models.transformer import STANDARD_COUNT, TransformerShape

SHAPE = TransformerShape("gpt", layers=12, d_model=768, heads=12, mlp_dim=3072, seq_len=1024,
                         vocab=50_257)

SPEC = ModelSpec(
    name="gpt2",
    input_shape=(SHAPE.seq_len,),
    num_classes=SHAPE.vocab,
    params=124_439_808,  # Hugging Face's GPT2LMHeadModel (tied head), biases included
    trainable_params=124_439_808,
    flops_per_sample=SHAPE.forward_flops_per_sample(),
    description="GPT-2 small: 12 layers, d 768, 12 heads, context 1024, vocab 50,257, tied "
                "embeddings",
    input_kind="tokens",
    workload="transformer",
    flops_source=STANDARD_COUNT,
    transformer=SHAPE,
)

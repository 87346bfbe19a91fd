"""GPT-2's code at toy size: two layers, d 128, a 2,048-token vocabulary, context 64 (a CPU
step well under a second), for tests and smoke sweeps."""

from models import ModelSpec
from models.transformer import STANDARD_COUNT, TransformerShape

SHAPE = TransformerShape("gpt", layers=2, d_model=128, heads=4, mlp_dim=512, seq_len=64,
                         vocab=2_048)

SPEC = ModelSpec(
    name="gpt2_tiny",
    input_shape=(SHAPE.seq_len,),
    num_classes=SHAPE.vocab,
    params=SHAPE.params(),  # 667,136
    trainable_params=SHAPE.params(),
    flops_per_sample=SHAPE.forward_flops_per_sample(),
    description="GPT-2 at toy size: 2 layers, d 128, 4 heads, context 64, vocab 2,048, tied "
                "embeddings",
    input_kind="tokens",
    workload="transformer",
    flops_source=STANDARD_COUNT,
    transformer=SHAPE,
)

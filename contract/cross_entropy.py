"""The `cross_entropy` option of torch_ddp and jax_native (issue 39): how the step's loss takes
next-token logits (batch, sequence, vocabulary). float32: the whole logits upcast, then
cross-entropy (what both ran before the option); bf16_logits: cross-entropy on the logits in
the dtype the model returns them (bf16 under precision bf16; fp32 logits: the same as float32);
chunked: torchtune's CEWithChunkedOutputLoss, the logits split along the sequence into
CHUNKS, each upcast and summed, over the token count. 2-D logits (a CNN's) take float32
whatever the option, recorded so. Framework-free (the catalogs import it)."""

from __future__ import annotations

from contract.catalog import Option

CHUNKS = 8  # torchtune's CEWithChunkedOutputLoss(num_output_chunks=8), its default
VALUES = ("float32", "bf16_logits", "chunked")

OPTION = Option(str, "float32", VALUES,
                "next-token logits' cross-entropy: float32 (the whole logits upcast), "
                "bf16_logits (in the dtype the model returns them; fp32 logits: no change), "
                f"or chunked (torchtune's CEWithChunkedOutputLoss: {CHUNKS} chunks along the "
                "sequence, each upcast alone); 2-D logits (CNNs): float32, the option does "
                "not apply")

# The equivalence cases: the probe is a CNN (2-D logits), so these check that the option runs
# and leaves the step alone there; its effect on a transformer's loss is tested on gpt2_tiny
EQUIVALENCE = ({"cross_entropy": "bf16_logits"}, {"cross_entropy": "chunked"})
NOTE_2D = ("2-D logits (one class per row): the option applies to next-token logits "
           "(batch, sequence, vocabulary); float32 cross-entropy as ever")
NOTE_FP32 = "the model returns float32 logits: bf16_logits computes what float32 does"


def applied(option: str, logits_rank: int, logits_dtype: str) -> tuple[str, str | None]:
    """(what the step's loss computes for `option` on logits of this rank and dtype, a note
    where that is not what the option says): 2-D logits take float32; bf16_logits on float32
    logits is float32's computation."""
    if logits_rank != 3:
        return "float32", NOTE_2D
    if option == "bf16_logits" and logits_dtype.endswith("float32"):
        return "float32", NOTE_FP32
    return option, None

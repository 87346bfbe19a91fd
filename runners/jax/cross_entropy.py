"""jax_native's `cross_entropy` option (contract/cross_entropy.py) on the step's logits, and
what JAX traced for it, read back from the loss's jaxpr: the dtype its `exp` ran in on the
vocabulary axis and the checkpointed (rematerialised) calls. Imports no framework at module
level.

Differs from the originals: `chunked` follows torchtune's CEWithChunkedOutputLoss (chunks
along the sequence, each upcast to float32, summed cross-entropy over the token count; no
ignore_index) in JAX, over blocks of the flattened (batch x sequence) positions where torchtune
splits the sequence (each of its chunks has every row; a split of the sequence would need a
transposed copy of the logits for jax.lax.map), each block's loss under jax.checkpoint so that
XLA keeps no block's float32 copy for backward.
Liger's fused linear-cross-entropy (a Triton GPU kernel) is not reproduced."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract import cross_entropy as ce
from contract.reasons import code

SOURCE = code("jax.cross_entropy_jaxpr")


def token_loss(logits: Any, labels: Any, option: str = "float32") -> Any:
    """Mean cross-entropy (optax.softmax_cross_entropy_with_integer_labels) over every row, or
    every position of next-token logits as `option` says; 2-D logits on float32 whatever it."""
    import jax.numpy as jnp
    import optax

    if logits.ndim != 3 or option == "float32":
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), labels).mean()
    if option == "bf16_logits":
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return chunked(logits, labels)


def chunked(logits: Any, labels: Any) -> Any:
    """torchtune's chunked cross-entropy in JAX: the (batch x sequence) positions in
    gcd(CHUNKS, positions) equal blocks (a reshape, no copy), jax.lax.map over them, each
    block's float32 loss summed under jax.checkpoint (recomputed in backward, so no block's
    float32 copy is kept for it); the sum over the positions."""
    import math

    import jax
    import jax.numpy as jnp
    import optax

    positions = labels.size
    chunks = math.gcd(ce.CHUNKS, positions)

    @jax.checkpoint
    def block_sum(block: tuple[Any, Any]) -> Any:
        part, targets = block
        return optax.softmax_cross_entropy_with_integer_labels(
            part.astype(jnp.float32), targets).sum()

    blocks = (logits.reshape(chunks, positions // chunks, logits.shape[-1]),
              labels.reshape(chunks, positions // chunks))
    return jax.lax.map(block_sum, blocks).sum() / positions


def traced(jaxpr: Any, vocab: int) -> dict[str, Any]:
    """Of a jaxpr and the jaxprs inside it: the dtypes of `exp` on arrays whose last axis is
    `vocab`, the count of checkpoint (remat) calls and the blocks a scan (lax.map) steps over."""
    dtypes: list[str] = []
    remat, blocks = 0, 1
    stack = [jaxpr]
    while stack:
        for eqn in stack.pop().eqns:
            name = eqn.primitive.name
            remat += name in ("checkpoint", "remat", "remat2")
            blocks = eqn.params["length"] if name == "scan" else blocks
            shape = getattr(eqn.outvars[0].aval, "shape", ())
            if name == "exp" and shape and shape[-1] == vocab:
                dtypes.append(str(eqn.outvars[0].aval.dtype))
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if hasattr(inner, "eqns"):
                    stack.append(inner)
    return {"computed_in": sorted(set(dtypes)), "vocab_exp_ops": len(dtypes),
            "checkpoint_calls": remat, "chunks": blocks}


@dataclass
class CrossEntropy:
    """The step's loss under the option; what the first trace of it made JAX trace."""

    option: str = "float32"
    read: dict[str, Any] = field(default_factory=dict)

    def __call__(self, logits: Any, labels: Any) -> Any:
        if not self.read:
            import jax

            args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (logits, labels)]
            jaxpr = jax.make_jaxpr(lambda a, b: token_loss(a, b, self.option))(*args)
            self.read = {"logits_dim": logits.ndim, "logits_dtype": str(logits.dtype),
                         **traced(jaxpr.jaxpr, logits.shape[-1])}
        return token_loss(logits, labels, self.option)

    def record(self) -> dict[str, Any]:
        """The record's `cross_entropy`: the option, what ran (contract.cross_entropy.applied)
        and what the traced loss says; applied None where no step traced it."""
        if not self.read:
            return {"cross_entropy": {"option": self.option, "applied": None,
                                      "note": "no step traced the loss"}}
        read = dict(self.read)
        ran, note = ce.applied(self.option, read.pop("logits_dim"), read["logits_dtype"])
        return {"cross_entropy": {
            "option": self.option, "applied": ran, **read, "source": SOURCE,
            **({"note": note} if note else {})}}

"""jax_native's `cross_entropy` option (contract/cross_entropy.py) on the step's logits, and
what JAX traced for it, read back from the loss's jaxpr: the dtype its `exp` ran in on the
vocabulary axis and the checkpointed (rematerialised) calls. Imports no framework at module
level.

Differs from the originals: `chunked` follows torchtune's CEWithChunkedOutputLoss (chunks
along the sequence, each upcast to float32, summed cross-entropy over the token count; no
ignore_index) in JAX: jnp.array_split of the model's whole logits, each chunk's loss under
jax.checkpoint so that XLA keeps no chunk's float32 copy for backward (it recomputes it there).
Liger's fused linear-cross-entropy (a Triton GPU kernel) is not reproduced."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract import cross_entropy as ce

SOURCE = ("jax.make_jaxpr of the step's loss on the logits' shape and dtype (traced with the "
          "step): the dtype of each `exp` over the vocabulary axis, the checkpoint calls")


def token_loss(logits: Any, labels: Any, option: str = "float32") -> Any:
    """Mean cross-entropy (optax.softmax_cross_entropy_with_integer_labels) over every row, or
    every position of next-token logits as `option` says; 2-D logits on float32 whatever it."""
    import jax
    import jax.numpy as jnp
    import optax

    if logits.ndim != 3 or option == "float32":
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), labels).mean()
    if option == "bf16_logits":
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @jax.checkpoint
    def chunk_sum(part: Any, targets: Any) -> Any:
        return optax.softmax_cross_entropy_with_integer_labels(
            part.astype(jnp.float32), targets).sum()

    pairs = zip(jnp.array_split(logits, ce.CHUNKS, axis=1),
                jnp.array_split(labels, ce.CHUNKS, axis=1), strict=True)
    return sum(chunk_sum(part, targets) for part, targets in pairs) / labels.size


def traced(jaxpr: Any, vocab: int) -> dict[str, Any]:
    """Of a jaxpr and the jaxprs inside it: the dtypes of `exp` on arrays whose last axis is
    `vocab`, and the count of checkpoint (remat) calls."""
    dtypes: list[str] = []
    remat = 0
    stack = [jaxpr]
    while stack:
        for eqn in stack.pop().eqns:
            name = eqn.primitive.name
            remat += name in ("checkpoint", "remat", "remat2")
            shape = getattr(eqn.outvars[0].aval, "shape", ())
            if name == "exp" and shape and shape[-1] == vocab:
                dtypes.append(str(eqn.outvars[0].aval.dtype))
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if hasattr(inner, "eqns"):
                    stack.append(inner)
    return {"computed_in": sorted(set(dtypes)), "vocab_exp_ops": len(dtypes),
            "checkpoint_calls": remat}


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
        and what the traced loss says."""
        read = dict(self.read)
        ran, note = ce.applied(self.option, read.pop("logits_dim"), read["logits_dtype"])
        return {"cross_entropy": {
            "option": self.option, "applied": ran,
            "chunks": ce.CHUNKS if ran == "chunked" else 1, **read, "source": SOURCE,
            **({"note": note} if note else {})}}

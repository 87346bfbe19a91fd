"""XLA's compiled memory analysis of jax_native's cross_entropy options (issue 39), without
running a step: for each model, precision and option, the temp bytes of (a) the loss alone
(value_and_grad of cross_entropy.token_loss on the logits' shape and dtype) and (b) jax_native's
whole train step (per-device BatchNorm layout, one device), both compiled from abstract
arguments. Run with the jax environment's python from the repository root:

    python -m tools.cross_entropy_memory gpt2_tiny:8 gpt2:2

(model:global batch). Prints one line per case; docs/runners/jax_native.md has the figures."""

from __future__ import annotations

import sys
from typing import Any

OPTIONS = ("float32", "bf16_logits", "chunked")


def abstract(tree: Any, sharding: Any) -> Any:
    """Shape-and-dtype leaves of `tree`, each in `sharding`."""
    import jax

    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


def loss_temp(shape: tuple[int, ...], dtype: Any, option: str) -> int:
    """Temp bytes of value_and_grad of the loss alone on logits of `shape` and `dtype`."""
    import jax
    import jax.numpy as jnp

    from runners.jax.cross_entropy import token_loss

    logits = jax.ShapeDtypeStruct(shape, dtype)
    labels = jax.ShapeDtypeStruct(shape[:-1], jnp.int32)
    grad = jax.jit(jax.value_and_grad(lambda a, b: token_loss(a, b, option)))
    return int(grad.lower(logits, labels).compile().memory_analysis().temp_size_in_bytes)


def step_temp(name: str, batch: int, dtype: Any, option: str) -> int:
    """Temp bytes of jax_native's compiled train step for `name` at global batch `batch`."""
    import jax
    import jax.numpy as jnp
    import optax

    from models import get_spec, load_builder
    from runners.jax import flax_step
    from runners.jax.cross_entropy import CrossEntropy

    spec = get_spec(name)
    model = load_builder(name, "flax")(spec, dtype=dtype)
    replicated, sharded = flax_step.make_shardings(jax.devices()[:1])
    x = jnp.zeros((1, *spec.input_shape), jnp.int32)
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))
    state = jax.eval_shape(flax_step.state_maker(model, optax.sgd(0.01, momentum=0.9)),
                           variables)
    tokens = jax.ShapeDtypeStruct((batch, *spec.input_shape), jnp.int32, sharding=sharded)
    step = flax_step.make_train_step(replicated, sharded, "per_device", {"train": True},
                                     loss_of=CrossEntropy(option))
    compiled, _ = flax_step.compile_step(step, abstract(state, replicated), tokens, tokens)
    return int(compiled.memory_analysis().temp_size_in_bytes)


def main(cases: list[str]) -> None:
    import jax.numpy as jnp

    from models import get_spec

    for case in cases:
        name, batch = case.split(":")
        spec = get_spec(name)
        for precision, dtype in (("bf16", jnp.bfloat16), ("fp32", None)):
            shape = (int(batch), spec.input_shape[0], spec.num_classes)
            copy = 4 * shape[0] * shape[1] * shape[2]
            for option in OPTIONS:
                print(f"{name} b{batch} {precision} {option}: loss alone "
                      f"{loss_temp(shape, dtype or jnp.float32, option):,} B, step "
                      f"{step_temp(name, int(batch), dtype, option):,} B "
                      f"(a float32 copy of the logits: {copy:,} B)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

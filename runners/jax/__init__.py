"""JAX family (the jax environment): jit + sharding, Keras 3 on JAX, the Grain pipeline and the
pipeline mode."""

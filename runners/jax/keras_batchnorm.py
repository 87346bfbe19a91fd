"""Per-device BatchNorm for Keras 3 on JAX (keras_jax's `batchnorm: per_device`): the model cloned
with every BatchNormalization replaced by a subclass that normalises each device's rows under
jax.shard_map and updates the moving statistics with the devices' mean moments."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contract.reasons import code

if TYPE_CHECKING:
    import keras

BATCHNORM_MODES = ("per_device", "global")
BATCHNORM_RECORD = {
    "per_device": code("jax.keras_batchnorm_per_device"),
    "global": code("jax.keras_batchnorm_global"),
}


def per_device_batchnorm(keras: Any, model: keras.Model) -> keras.Model:
    """The model cloned with every BatchNormalization replaced by PerDeviceBatchNormalization
    (same config, same weights; a model without BatchNorm comes back as a clone too): its
    training call normalises each device's rows with their own moments (jax.shard_map over
    DataParallel's mesh, split along its batch axis) and updates the moving statistics with
    the mean over devices of those moments."""
    import jax
    from jax.sharding import PartitionSpec as P

    ops = keras.ops

    class PerDeviceBatchNormalization(keras.layers.BatchNormalization):
        def call(self, inputs: Any, training: bool | None = None, mask: Any = None) -> Any:
            distribution = keras.distribution.distribution()
            if not (training and self.trainable) or distribution is None or mask is not None \
                    or self.renorm:
                return super().call(inputs, training=training, mask=mask)
            dtype = keras.backend.result_type(inputs.dtype, "float32")  # as Keras upcasts
            x = ops.cast(inputs, dtype)
            channels = x.shape[self.axis]
            gamma = ops.cast(self.gamma, dtype) if self.scale else ops.ones((channels,), dtype)
            beta = ops.cast(self.beta, dtype) if self.center else ops.zeros((channels,), dtype)
            axes, axis, epsilon = self._reduction_axes, self.axis, self.epsilon

            def local(x: Any, gamma: Any, beta: Any) -> tuple[Any, Any, Any]:
                mean, variance = ops.moments(x, axes=axes)
                y = ops.batch_normalization(x, mean, variance, axis=axis, offset=beta,
                                            scale=gamma, epsilon=epsilon)
                return y, mean[None], variance[None]

            name = distribution.batch_dim_name
            y, means, variances = jax.shard_map(
                local, mesh=distribution.device_mesh.backend_mesh,
                in_specs=(P(name), P(), P()), out_specs=(P(name), P(name), P(name)))(
                    x, gamma, beta)
            momentum = self.momentum
            self.moving_mean.assign(ops.cast(self.moving_mean, dtype) * momentum
                                    + ops.mean(means, axis=0) * (1.0 - momentum))
            self.moving_variance.assign(ops.cast(self.moving_variance, dtype) * momentum
                                        + ops.mean(variances, axis=0) * (1.0 - momentum))
            return ops.cast(y, self.compute_dtype)

    def clone(layer: Any) -> Any:
        if type(layer) is keras.layers.BatchNormalization:
            return PerDeviceBatchNormalization.from_config(layer.get_config())
        return layer.__class__.from_config(layer.get_config())

    clone_model = keras.models.clone_model(model, clone_function=clone)
    clone_model.set_weights(model.get_weights())
    return clone_model


def keras_moving_stats(keras: Any, model: keras.Model) -> tuple[bool, str]:
    """(whether every BatchNormalization layer's moving mean and variance is finite, the first
    that is not / how many were read), from the model's variables."""
    import numpy as np

    count = 0
    for layer in model._flatten_layers(include_self=False):
        if not isinstance(layer, keras.layers.BatchNormalization):
            continue
        for variable in (layer.moving_mean, layer.moving_variance):
            value = np.asarray(variable.numpy())
            bad = int(value.size - np.isfinite(value).sum())
            if bad:
                return False, f"{variable.path}: {bad} of {value.size} not finite"
            count += 1
    return True, f"{count} BatchNorm moving statistics finite"


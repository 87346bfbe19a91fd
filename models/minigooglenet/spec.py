"""MiniGoogLeNet as in seed 004 (CIFAR-10 sized): the model of its multi_gpu_model figures."""

from models import ModelSpec

SPEC = ModelSpec(
    name="minigooglenet",
    input_shape=(32, 32, 3),
    num_classes=10,
    # 1,656,250 as Keras' model.summary() counts it, BatchNorm moving statistics included;
    # 3,424 of those are the moving means and variances.
    params=1_656_250,
    trainable_params=1_652_826,
    # 2 x 234,597,920 multiply-adds, counted by models.keras_common.count_flops_keras.
    flops_per_sample=469_195_840,
    description="MiniGoogLeNet (seed 004): conv-BN-ReLU, inception and downsample modules",
)

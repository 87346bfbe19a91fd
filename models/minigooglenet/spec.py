"""MiniGoogLeNet (PyImageSearch, seed 004), CIFAR-10 sized: the model of its multi-GPU figures."""

from models import cnn_spec

# The architecture every framework's builder follows: (1x1 filters, 3x3 filters) of each
# inception module, ("down", 3x3 filters) for a downsample module.
LAYOUT = ((32, 32), (32, 48), ("down", 80), (112, 48), (96, 64), (80, 80), (48, 96),
          ("down", 96), (176, 160), (176, 160))

SPEC = cnn_spec(
    "minigooglenet", (32, 32, 3), 10,
    # params 1,656,250 as Keras' model.summary() counts the original (conv layers keep their
    # bias): 1,652,826 trainable + 3,424 BatchNorm moving means and variances (1,712 channels).
    trainable_params=1_652_826, bn_channels=1_712,
    # 2 x 234,597,920 multiply-adds: models.keras_common.count_flops_keras on the Keras builder
    # (TF 2.21 / Keras 3.15), the same in both data formats.
    flops_per_sample=469_195_840,
    description="MiniGoogLeNet: conv-BN-ReLU, 9 inception and 2 downsample modules, 32x32x3")

"""A small CNN with BatchNorm for 32x32 images: the model of mode converge's quick runs (digits).

Two conv-BN-ReLU-maxpool blocks, flattened into a dense layer: 40x fewer FLOPs than
MiniGoogLeNet, so a CPU trains digits to 90%+ held-out accuracy in seconds, with the BatchNorm
layers whose moving statistics seed 002's short-last-batch trap poisons. BatchNorm's moving
averages use momentum 0.9 (Keras' term; torch's 0.1, its default), not Keras' default 0.99:
digits has 45 steps per epoch at batch 32, too few for 0.99's averages to catch up (the held-out
accuracy then reads the initial statistics)."""

from models import cnn_spec

# (filters of each 3x3 conv block); each block: Conv2D(same, bias) -> BatchNorm -> ReLU ->
# MaxPool 2x2/2; then flatten (8 x 8 x 64) -> Dense(num_classes).
FILTERS = (32, 64)
BN_MOMENTUM = 0.9  # Keras' meaning: moving = 0.9 x moving + 0.1 x batch (torch momentum 0.1)
BN_EPSILON = 1e-3  # Keras' default

SPEC = cnn_spec(
    "small_cnn", (32, 32, 3), 10,
    # conv 3*3*3*32 + 32 = 896; BN 4*32 = 128; conv 3*3*32*64 + 64 = 18,496; BN 4*64 = 256;
    # dense 8*8*64*10 + 10 = 40,970: params 60,746, of which BatchNorm's 2*(32 + 64) = 192
    # moving means and variances are not trainable.
    trainable_params=60_554, bn_channels=32 + 64,
    # conv1 2*32*32*(3*3*3*32) = 1,769,472; conv2 2*16*16*(3*3*32*64) = 9,437,184;
    # dense 2*4096*10 = 81,920.
    flops_per_sample=11_288_576,
    description="small CNN: 2 x (conv3x3-BN-ReLU-maxpool), 32 and 64 filters, flatten, dense; "
                "32x32x3 (mode converge's quick model)")

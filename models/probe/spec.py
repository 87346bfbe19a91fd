"""A tiny model without BatchNorm or dropout for the data-parallel equivalence test."""

from models import ModelSpec

# Canonical weights in Keras layout (HWIO conv kernel; the dense kernel's rows in NHWC flatten
# order). Every framework's builder maps its own layout to and from these names.
WEIGHTS: list[tuple[str, tuple[int, ...]]] = [
    ("conv/kernel", (3, 3, 3, 4)),
    ("conv/bias", (4,)),
    ("dense/kernel", (256, 10)),
    ("dense/bias", (10,)),
]

SPEC = ModelSpec(
    name="probe",
    input_shape=(8, 8, 3),
    num_classes=10,
    params=2_682,  # 108 + 4 + 2,560 + 10, all trainable
    trainable_params=2_682,
    # conv 2*3*3*3*4 * 8*8 = 13,824 + dense 2*256*10 = 5,120; count_flops_keras agrees.
    flops_per_sample=18_944,
    description="Conv2D 3x3x4 + bias + ReLU, flatten, dense 10, softmax (equivalence test only)",
    weights=tuple(WEIGHTS),
)

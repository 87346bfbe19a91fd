"""A tiny model without BatchNorm or dropout for the data-parallel equivalence test."""

from models import ModelSpec

SPEC = ModelSpec(
    name="probe",
    input_shape=(8, 8, 3),
    num_classes=10,
    params=2_682,
    trainable_params=2_682,
    flops_per_sample=18_944,  # conv 2x3x3x3x4x64 + dense 2x256x10
    description="conv 3x3x4 + ReLU, flatten, dense 10: for the equivalence test only",
    # Canonical weights (Keras layout: HWIO kernels, dense input in NHWC flatten order); every
    # framework's builder maps its own layout to these names.
    weights=(
        ("conv/kernel", (3, 3, 3, 4)),
        ("conv/bias", (4,)),
        ("dense/kernel", (256, 10)),
        ("dense/bias", (10,)),
    ),
)

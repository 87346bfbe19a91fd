"""ResNet-50 v1.5 (torchvision's resnet50), ImageNet sized: the model of the 2017 benchmarks."""

from models import cnn_spec

# The architecture every framework's builder follows: (width, blocks, first stride) per stage.
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))

SPEC = cnn_spec(
    "resnet50", (224, 224, 3), 1000,
    # torchvision's 25,557,032 is sum(p.numel() for p in parameters()), which leaves out the
    # BatchNorm running statistics: that is trainable_params here. params (25,610,152) adds the
    # 53,120 moving means and variances (26,560 BN channels x 2) that Keras counts in
    # model.count_params().
    trainable_params=25_557_032, bn_channels=26_560,
    # 2 x 4,089,184,256 multiply-adds of the conv and dense layers at 224x224 (the usual
    # "4.1 GMACs"): models.keras_common.count_flops_keras on the Keras builder (TF 2.21 /
    # Keras 3.15), the same in both data formats.
    flops_per_sample=8_178_368_512,
    description="ResNet-50 v1.5: stride on the 3x3 bottleneck conv, no conv bias, 224x224x3")

"""ResNet-50 v1.5: the model every 2017 benchmark in the seeds measured (ImageNet-sized)."""

from models import ModelSpec

SPEC = ModelSpec(
    name="resnet50",
    input_shape=(224, 224, 3),
    num_classes=1000,
    # 25,557,032 trainable parameters, as torchvision counts ResNet-50 (parameters() excludes
    # BatchNorm's running statistics); with those 53,120 moving means and variances, 25,610,152.
    params=25_610_152,
    trainable_params=25_557_032,
    # 2 x 4,089,184,256 multiply-adds of the conv and dense layers at 224x224 (the usual
    # "4.1 GMACs"), counted by models.keras_common.count_flops_keras on the Keras builder.
    flops_per_sample=8_178_368_512,
    description="ResNet-50 v1.5: stride on the 3x3 bottleneck conv, no conv bias, 224x224x3",
)

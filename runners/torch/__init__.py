"""PyTorch family (the torch and horovod environments): DDP, Keras 3 on torch, Horovod on the
same torchrun rank helpers (dist.py), the DataLoader pipeline and the pipeline mode."""

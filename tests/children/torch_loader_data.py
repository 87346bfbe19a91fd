"""The shared part of the torch DataLoader checks: the real dataset at a path, opened with an
augmentation and a worker count as a spec would ask."""

from contract.spec import spec_for
from runners.real_data import RealData, open_dataset


def data(path: str, augmentation: str, workers: int) -> RealData:
    return open_dataset(spec_for(**{"data": "real", "dataset": {
        "path": path, "augmentation": augmentation, "workers": workers}}))

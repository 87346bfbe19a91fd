"""The torch DataLoader's shares of the dataset in argv[1] for ranks 0 and 1 of 2, over two
epochs (crop-flip, 1 worker). Prints one line "RESULT <json>"."""

import json
import sys

from runners.torch.data import epochs, make_dataloader
from tests.children.torch_loader_data import data

seen = {}
for rank in (0, 1):
    stream = epochs(make_dataloader(data(sys.argv[1], "crop-flip", 1), 32, 8, rank, 2))
    # 24 images per rank and epoch: 3 batches an epoch, two epochs
    seen[rank] = [sorted(int(i) for b in [next(stream) for _ in range(3)] for i in b[2])
                  for _ in range(2)]
print("RESULT " + json.dumps(seen))

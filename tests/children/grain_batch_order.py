"""File indices of Grain's batch argv[2] over argv[1] files, for each global batch size in
argv[3:]. Prints one line "RESULT <json>"."""

import json
import sys

from runners.jax.data import batch_file_indices

n, warmup = int(sys.argv[1]), int(sys.argv[2])
print("RESULT " + json.dumps({b: batch_file_indices(n, int(b), warmup) for b in sys.argv[3:]}))

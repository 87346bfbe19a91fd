"""Build the DeepSpeed op that importing deepspeed compiles, into the running interpreter's
environment (the torch family's post-install step: run by bench/run/envs.py after the lock is
installed, with the environment's interpreter and the variant, `cpu` | `gpu`, as argv[1]).

Why: DeepSpeed comes from PyPI as a source distribution and builds as pure Python (no op
precompiled: pip builds it without torch, so DS_BUILD_OPS cannot apply). On its CPU accelerator
its communication backend (deepspeed.comm.torch.TorchBackend) JIT-compiles its shared-memory
all-reduce op, deepspeed_shm_comm, whenever it starts -- with ninja and the host's C++
compiler, into TORCH_EXTENSIONS_DIR. The deepspeed runner (runners/torch/deepspeed_zero.py,
extensions_dir) points TORCH_EXTENSIONS_DIR at <env>/torch_extensions, so this builds it there
once, with the same builder DeepSpeed uses, and a run only loads it. The runner uses a torch
optimizer: no other op is ever compiled. On GPUs (CUDA accelerator) DeepSpeed builds nothing at
start; the step says so and does nothing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

variant = sys.argv[1] if len(sys.argv) > 1 else "cpu"
os.environ["TORCH_EXTENSIONS_DIR"] = str(Path(sys.prefix) / "torch_extensions")
os.environ["DS_ACCELERATOR"] = "cpu" if variant == "cpu" else "cuda"

import deepspeed  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402

builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if variant != "cpu" or builder is None:
    print(f"deepspeed {deepspeed.__version__} ({variant}): no op to build at install")
    sys.exit(0)
if not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
    print(f"deepspeed {deepspeed.__version__}: {builder.NAME} is not compatible here; "
          "DeepSpeed will not build it either")
    sys.exit(0)
t0 = time.monotonic()
builder.load(verbose=False)
print(f"deepspeed {deepspeed.__version__}: built {builder.absolute_name()} into "
      f"{os.environ['TORCH_EXTENSIONS_DIR']} in {time.monotonic() - t0:.0f} s")

"""The local 2-node SLURM cluster's tool and state folder (tools/local_slurm.sh, docs/SLURM.md)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers.cli import REPO

SLURM_TOOL = REPO / "tools" / "local_slurm.sh"
STATE_DIR = Path(os.environ.get("MGBENCH_SLURM_DIR", "/tmp/mgbench-slurm"))

"""mgbench: the parent side of the multi-GPU benchmark harness.

Nothing in this package imports a deep-learning framework: frameworks fix global state at
import, so every run happens in a child process (see runners/).
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
__version__ = "0.1.0"

"""write_json_atomic over an existing record (argv[1]) under a 2 KiB file-size limit, as on a
full disk: the outcome and the files left in the folder. Prints one line "RESULT <json>"."""

import json
import resource
import signal
import sys
from pathlib import Path

from bench.records.store import write_json_atomic

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk: writes fail with EFBIG/ENOSPC
path = Path(sys.argv[1])
write_json_atomic(path, {"run_id": "r", "status": "ok"})  # the record as it was
resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
try:
    write_json_atomic(path, {"run_id": "r", "status": "ok", "big": "x" * 100_000})
    outcome = "written"
except OSError as exc:
    outcome = f"OSError errno {exc.errno}"
print("RESULT " + json.dumps({"outcome": outcome,
                              "files": sorted(p.name for p in path.parent.iterdir())}))

"""Where tf_cnn_benchmarks' checkout is and which of our models it has a twin of: the
runner's own checks (runners/tf/cnn_benchmarks.py), asked by the parent before the launch in
the words the child would record. Stdlib only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from contract.spec import Unavailable

ENV_VAR = "TF_CNN_BENCHMARKS_DIR"
SCRIPT = "tf_cnn_benchmarks.py"
SUBDIR = Path("scripts") / "tf_cnn_benchmarks"
HOW_TO_GET = (f"git clone https://github.com/tensorflow/benchmarks and set {ENV_VAR}=<that "
              f"folder> or runner_options.tf_cnn_benchmarks.benchmarks_dir in the config")
# our model name -> the script's --model; models missing here have no tf_cnn_benchmarks twin
MODEL_NAMES = {"resnet50": "resnet50_v1.5"}
# --model values that build one of our models (script_model option): "resnet50" is v1 (stride on
# the first 1x1 conv), the ResNet-50 of TF's May 2017 tables (benchmarks commit 9165a70 had
# no v1.5); our models/resnet50 is v1.5 (stride on the 3x3), the default.
SCRIPT_MODELS = {"resnet50": ("resnet50_v1.5", "resnet50")}
NO_MODEL = {"minigooglenet": "MiniGoogLeNet (a CIFAR-sized GoogLeNet) is not among "
                             "tf_cnn_benchmarks' models (its 'googlenet' is the ImageNet one)",
            "probe": "the probe model exists only for the equivalence test"}

def find_script(options: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Path:
    """The checkout's tf_cnn_benchmarks.py, from the benchmarks_dir option or $TF_CNN_BENCHMARKS_DIR
    (the repository root or its scripts/tf_cnn_benchmarks folder); Unavailable if neither."""
    environ = os.environ if environ is None else environ
    given = options.get("benchmarks_dir") or environ.get(ENV_VAR)
    source = ("runner_options.tf_cnn_benchmarks.benchmarks_dir" if options.get("benchmarks_dir")
              else ENV_VAR)
    if not given:
        raise Unavailable(f"no tensorflow/benchmarks checkout: neither {ENV_VAR} nor "
                          f"runner_options.tf_cnn_benchmarks.benchmarks_dir is set; "
                          f"{HOW_TO_GET}")
    root = Path(given).expanduser()
    for candidate in (root / SCRIPT, root / SUBDIR / SCRIPT):
        if candidate.is_file():
            return candidate.resolve()
    raise Unavailable(f"{source}={given} holds no {SCRIPT} (looked in it and in its {SUBDIR}); "
                      f"{HOW_TO_GET}")


def script_model(model: str) -> str:
    """The script's --model for one of our models; Unavailable when it has none."""
    if model in MODEL_NAMES:
        return MODEL_NAMES[model]
    why = NO_MODEL.get(model, f"no tf_cnn_benchmarks model is mapped to {model!r}")
    raise Unavailable(f"tf_cnn_benchmarks cannot run {model}: {why} "
                      f"(mapped models: {', '.join(sorted(MODEL_NAMES))})")


def check_model_in_checkout(script: Path, name: str) -> None:
    """Unavailable if the checkout's models/model_config.py does not define --model=name."""
    config = script.parent / "models" / "model_config.py"
    if config.is_file() and f"'{name}'" not in config.read_text(errors="replace"):
        raise Unavailable(f"the checkout's {config} has no model {name!r}")

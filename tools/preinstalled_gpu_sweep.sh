#!/usr/bin/env bash
# Run a sweep on a GPU machine that has no package registry but an image with PyTorch and JAX
# already installed (the device machines this project is lent; a locked-down cluster node).
# The torch and jax family runners use that interpreter (runner_options.<runner>.python); the
# other families' environments cannot be built offline, so their rows say unavailable with
# pip's reason (PIP_NO_INDEX makes that immediate instead of a minute of retries).
#
#   tools/preinstalled_gpu_sweep.sh PYTHON OUT_DIR [run_bench.py args ...]
#
# Keras 3 (keras_torch, keras_jax) must be importable by PYTHON: put its wheel's contents on
# PYTHONPATH first if the image lacks it.
set -u
py=$1; out=$2; shift 2
# runner_options may name only runners of the sweep: set the interpreter of those of the four
# that this sweep (the config with the --set arguments given) runs
in_sweep=$(PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "$py" - "$@" 2>/dev/null <<'PY'
import argparse
import sys

from bench.plan.config import ConfigError, load_config

p = argparse.ArgumentParser(add_help=False)
p.add_argument("--config")
p.add_argument("--set", action="append", default=[])
args, _ = p.parse_known_args(sys.argv[1:])
try:
    print(" ".join(load_config(args.config, args.set).runners) if args.config else "")
except ConfigError:
    pass  # run_bench.py says what is wrong
PY
)
sets=()
for r in torch_ddp keras_torch jax_native keras_jax; do
  case " $in_sweep " in *" $r "*) sets+=(--set "runner_options.$r.python=$py") ;; esac
done
PIP_NO_INDEX=1 exec "$py" run_bench.py "$@" ${sets[@]+"${sets[@]}"} --out "$out"

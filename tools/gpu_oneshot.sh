#!/usr/bin/env bash
# One-shot GPU check on a machine without a package registry (docs/USAGE.md, "A GPU machine
# without a registry"): PYTHON holds PyTorch and JAX; WHEELS is a folder of the wheels it lacks
# (Keras 3 and its needs, pydantic and its needs: the download command is in docs/USAGE.md).
# The wheels go into a private folder put on PYTHONPATH; each CONFIG (default
# configs/gpu-smoke.yaml) runs through tools/preinstalled_gpu_sweep.sh (the torch and jax
# runners in PYTHON, the other families unavailable with pip's reason); every results folder,
# with MANIFEST.txt (the machine's GPUs, the Python, the wheels, each sweep's exit status), is
# packed into ARCHIVE (.tar.gz). Exits with the first non-zero exit status of a sweep (the
# archive is written either way), 2 on bad arguments, 1 when the wheels do not install.
#
#   tools/gpu_oneshot.sh PYTHON WHEELS ARCHIVE [CONFIG ...] [-- run_bench.py args ...]
set -u
die() { echo "gpu_oneshot: $*" >&2; exit 2; }
[[ $# -ge 3 ]] || die "usage: $0 PYTHON WHEELS ARCHIVE [CONFIG ...] [-- run_bench.py args ...]"
py=$1; wheels=$2; archive=$3; shift 3
configs=(); extra=()
while [[ $# -gt 0 ]]; do
  if [[ $1 == -- ]]; then shift; extra=("$@"); break; fi
  configs+=("$1"); shift
done
[[ ${#configs[@]} -gt 0 ]] || configs=("$(dirname "$0")/../configs/gpu-smoke.yaml")
given=$py
[[ -x $py && -f $py ]] || py=$(command -v "$py" 2>/dev/null) \
  || die "PYTHON: '$given' is not an executable"
[[ -d $wheels ]] || die "WHEELS: '$wheels' is not a folder (it may be empty)"
[[ $archive == *.tar.gz ]] || die "ARCHIVE: '$archive' must end in .tar.gz"
[[ -d $(dirname "$archive") && -w $(dirname "$archive") ]] \
  || die "ARCHIVE: '$(dirname "$archive")' is not a folder this user can write in"
for i in "${!configs[@]}"; do
  [[ -f ${configs[$i]} ]] || die "CONFIG: '${configs[$i]}' is not a file"
  configs[$i]=$(realpath "${configs[$i]}")
done
wheels=$(realpath "$wheels"); archive=$(realpath -m "$archive")
cd "$(dirname "$0")/.." || exit 2  # the repository: run_bench.py and the tools

work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
site=$work/site
shopt -s nullglob
found=("$wheels"/*.whl)
if [[ ${#found[@]} -gt 0 ]]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "${found[@]}" || { echo "gpu_oneshot: the wheels in $wheels did not install" >&2; exit 1; }
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi

name=oneshot-$(date -u +%Y%m%dT%H%M%SZ)
pack=$work/$name
mkdir -p "$pack"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname)"
  echo "gpus: $(nvidia-smi -L 2>/dev/null | paste -sd';' - || true)"
  echo "python: $py ($("$py" -c 'import sys; print(sys.version.split()[0])' 2>&1))"
  echo "wheels: $(for w in "${found[@]}"; do basename "$w"; done | paste -sd' ' -)"
} > "$pack/MANIFEST.txt"
first=0
for c in "${configs[@]}"; do
  stem=$(basename "$c" .yaml)
  out=$pack/$stem
  tools/preinstalled_gpu_sweep.sh "$py" "$out" --config "$c" ${extra[@]+"${extra[@]}"}
  rc=$?
  echo "sweep: $(basename "$c") exit $rc -> $name/$stem" >> "$pack/MANIFEST.txt"
  [[ $first -ne 0 || $rc -eq 0 ]] || first=$rc
done
tar -czf "$archive" -C "$work" "$name" || { echo "gpu_oneshot: cannot write $archive" >&2; exit 1; }
echo "gpu_oneshot: $archive (${#configs[@]} sweeps; exit $first)"
exit "$first"

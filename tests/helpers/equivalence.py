"""The data-parallel equivalence step (docs/DESIGN.md): the probe's inputs, one SGD step of a
runner on n devices through the harness's launch, and the weights it wrote."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench.catalog.registry import RUNNERS
from bench.plan.runs import RunSpec
from bench.run.launch import launch
from models import get_spec
from tests.specs import run_spec

BATCH, LR, RTOL = 16, 0.5, 1e-5


def make_inputs(path: Path) -> None:
    """Initial weights (canonical names and layouts from the probe spec) and one batch."""
    rng = np.random.default_rng(1234)
    weights = {f"w:{name}": (rng.standard_normal(shape) * 0.3).astype(np.float32)
               for name, shape in get_spec("probe").weights}
    h, w, c = get_spec("probe").input_shape
    x = rng.standard_normal((BATCH, h, w, c)).astype(np.float32)
    y = rng.integers(0, get_spec("probe").num_classes, BATCH).astype(np.int32)
    np.savez(path, x=x, y=y, **weights)


def load_weights(path: Path) -> dict[str, np.ndarray]:
    """The weights of an inputs or output .npz, under their canonical names."""
    with np.load(path) as data:
        return {k[2:]: data[k] for k in data.files if k.startswith("w:")}


def equivalence_spec(runner: str, family: str, module: str, num_nodes: int, inputs: Path,
                     out: Path) -> RunSpec:
    """The equivalence step of `runner` on one device per node (the multi-node tests)."""
    return run_spec(runner=runner, family=family, module=module, model="probe",
                    num_nodes=num_nodes, num_devices=num_nodes, scaling="strong",
                    global_batch_size=BATCH, batch_size_per_device=BATCH // num_nodes,
                    warmup_steps=0, measure_steps=1, mode="equivalence",
                    equivalence={"inputs": str(inputs), "output": str(out),
                                 "learning_rate": LR})


def step(runner: str, n: int, inputs: Path, tmp_path: Path, python: str,
         options: dict | None = None) -> dict:
    """Weights after one step of `runner` on n devices (its default options, then `options`)."""
    info = RUNNERS[runner]
    out = tmp_path / f"{runner}-n{n}.npz"
    spec = RunSpec(
        run_id=f"eq-{runner}-n{n}", sweep_id="eq", runner=runner, family=info.family,
        module=info.module, model="probe", num_devices=n, device="cpu", virtual_devices=True,
        scaling="strong", batch_size_per_device=BATCH // n, global_batch_size=BATCH,
        data="synthetic", precision="fp32", warmup_steps=0, measure_steps=1, repeat=0,
        timeout_s=300,
        options={**{name: opt.default for name, opt in info.options.items()}, **(options or {})},
        mode="equivalence", launcher=info.launcher,
        equivalence={"inputs": str(inputs), "output": str(out), "learning_rate": LR})
    rec = launch(spec, python, tmp_path, {})
    assert rec["status"] == "ok", (rec["reason"], Path(rec["log_path"]).read_text()[-3000:])
    # where the step ran, as the framework reports it (the parent already refused a
    # multi-device run whose placement does not cover its devices)
    placement = rec["placement"]
    assert placement and all(v > 0 for v in placement.values()), placement
    if n > 1 and not rec["result"].get("placement_collapsed"):
        assert len(placement) >= n, placement
    with np.load(out) as data:
        return {k[2:]: data[k] for k in data.files}


# Options that cannot change a 1-device step: they say how replicas reduce, shard or place
# what the devices share, and one replica has nothing to reduce, shard or place apart. A case
# of only such options compares its 2-device step with the runner's 1-device step at its
# defaults, run once per runner (tests/test_equivalence.py); every other option is run at 1
# device too. runner -> {option: why one device's step is the same}.
ONE_DEVICE_UNCHANGED: dict[str, dict[str, str]] = {
    "torch_ddp": {"gradient_as_bucket_view": "DDP's buckets as gradient views: how the "
                  "allreduce reads the gradients"},
    "torch_fsdp2": {"reshard_after_forward": "whether the parameters re-shard across ranks "
                    "between forward and backward; one rank's shard is all of them"},
    "deepspeed": {"stage": "which state ZeRO partitions across ranks; one rank holds all of it"},
    "tf_mirrored": {"cross_device_ops": "how the replicas' gradients are all-reduced; one "
                    "replica has nothing to reduce"},
    "mxnet_native": {"kvstore": "where the contexts' gradients are summed; one context's sum "
                     "is its gradient"},
    "jax_native": {"batchnorm": "per-replica or global batch statistics: one replica's batch "
                   "is the global batch (and the probe has no BatchNorm)"},
    "keras_jax": {"batchnorm": "per-replica or global batch statistics: one replica's batch "
                  "is the global batch (and the probe has no BatchNorm)",
                  "input": "preplaced: the batch already in the devices' layout, which on one "
                  "device is the whole batch on it"},
    "keras_model_parallel": {"input": "preplaced: the batch already in the devices' layout, "
                             "which on one device is the whole batch on it"},
    "tensorpack": {"trainer": "parameter_server: where the variables live and the towers' "
                   "gradients are averaged; one tower's average is its gradient, and every "
                   "device here is the one CPU"},
}


def one_device_options(runner: str, options: dict) -> dict:
    """The options whose 1-device step a case compares with: `options` less those that cannot
    change a 1-device step (ONE_DEVICE_UNCHANGED)."""
    same = ONE_DEVICE_UNCHANGED.get(runner, {})
    assert set(same) <= set(RUNNERS[runner].options), (runner, same)  # a misspelt option
    return {k: v for k, v in options.items() if k not in same}


def steps_at_once(runner: str, inputs: Path, tmp_path: Path, python: str,
                  options: tuple[dict, dict]) -> tuple[dict, dict]:
    """step() on 1 device (at options[0]) in a forked process while this one runs it on 2
    devices (at options[1]): the two children start, import and build at the same time, each
    through the harness's launch in a process of its own (launch handles signals, so it runs
    in a main thread)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        one = pool.submit(step, runner, 1, inputs, tmp_path, python, options[0])
        two = step(runner, 2, inputs, tmp_path, python, options[1])
        return one.result(), two

"""The JAX family's sharded runners (issue 27) for real on CPU: jax_fsdp and keras_model_parallel
on gpt2_tiny at 2 virtual CPU devices through the CLI (neither takes another path at 1 device),
each record showing its params, gradients and optimizer state split over both devices as
jax's addressable_shards report them (the data-parallel baselines' full replicas are checked on
their own shared runs in tests/test_jax_runners.py, with assert_replicas); and the pure helpers
(the FSDP dimension rule, the HLO reduction dtypes)."""

from __future__ import annotations

import pytest

from bench.records.store import check_record
from runners.jax.fsdp import fsdp_dimension
from runners.jax.state import reduction_dtypes
from tests.helpers.sharding import assert_split
from tests.helpers.sweeps import smoke_sweep

SHARDED = ("jax_fsdp", "keras_model_parallel")


@pytest.fixture(scope="module")
def sharded_sweep(tmp_path_factory: pytest.TempPathFactory, jax_python: str
                  ) -> dict[str, dict]:
    """jax_fsdp and keras_model_parallel on gpt2_tiny at 2 devices (1 warm-up, 3 timed steps,
    4 sequences per device); records by runner."""
    from bench.records.store import load_records

    out = tmp_path_factory.mktemp("sharded")
    smoke_sweep(out, f"runners=[{','.join(SHARDED)}]", "models=[gpt2_tiny]", "devices=[2]",
                "warmup_steps=1", "batch_size_per_device=4")
    records = load_records(out)
    assert sorted((r["runner"], r["num_devices"]) for r in records) == [(s, 2) for s in SHARDED]
    return {r["runner"]: r for r in records}


@pytest.mark.slow
@pytest.mark.framework("jax")
@pytest.mark.parametrize("runner", SHARDED)
def test_state_split_over_two_devices(sharded_sweep: dict, runner: str) -> None:
    rec = sharded_sweep[runner]
    assert check_record(rec) == []
    assert rec["status"] == "ok", rec["reason"]
    assert rec["samples"] == 3 * 4 * 2
    assert_split(rec, 2)
    policy = rec["precision_policy"]
    assert policy["follows"] is True and policy["params"] == "float32"
    assert policy["compute"] == "float32" and policy["reduce"] == "float32"


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_jax_fsdp_layout_and_collectives(sharded_sweep: dict) -> None:
    result = sharded_sweep["jax_fsdp"]["result"]
    params = result["shardings"]["params"]
    assert params["mesh"] == {"fsdp": 2} and params["replicated"] == []
    # the MLP's first kernel (d, 4d) along its larger dimension, read back from jax
    assert params["leaves"]["h_0/fc/kernel"] == "P(None, 'fsdp')"
    assert result["shardings"]["batch"] == "NamedSharding(mesh={fsdp: 2}, spec=P('fsdp',))"
    assert result["collectives"]["all-gather"] > 0  # the weights gathered in the step
    assert sorted(result["placement"].values()) == [4, 4]


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_keras_model_parallel_layout(sharded_sweep: dict) -> None:
    result = sharded_sweep["keras_model_parallel"]["result"]
    layout = result["layout_map"]
    assert layout["mesh"] == {"batch": 1, "model": 2}
    assert layout["replicated_not_divisible"] == []
    sharded = layout["sharded_variables"]
    assert sharded["h0_fc1/kernel"] == "P(None, 'model')"
    assert sharded["h0_fc2/kernel"] == "P('model', None)"
    assert sharded["h0_attn/query/kernel"] == "P(None, 'model', None)"
    assert sharded["wte/embeddings"] == "P('model', None)"
    # a (1, 2) mesh: the whole global batch (8 sequences) on each device
    assert sorted(result["placement"].values()) == [8, 8]
    assert result["shardings"]["distribution"] == "ModelParallel"
    # warmup_steps 1 (issue 41 item 5): JAX compiled the train step in warm-up step 1, so the
    # settle rule (runners/jax/keras_fit.py) warmed up one step more, its bound recorded;
    # JAX compiled nothing in the window
    evidence = result["window_evidence"]
    assert [c["function"] for c in evidence["compiled_before_window"]] == ["jit(train_step)"]
    assert result["warmup_steps_run"] == 2
    assert "(3 at most): jax.keras_settle_compiles" in result["warmup_extended"]
    assert evidence["compiles"] == 0 and result["window_recompiled"] is None, evidence


def test_fsdp_dimension_is_the_largest_divisible() -> None:
    assert fsdp_dimension((128, 512), 2) == 1
    assert fsdp_dimension((512, 128), 4) == 0
    assert fsdp_dimension((3, 3, 64, 96), 2) == 3
    assert fsdp_dimension((128, 128), 2) == 0  # ties: the first
    assert fsdp_dimension((10,), 4) is None and fsdp_dimension((), 2) is None
    assert fsdp_dimension((3, 6), 4) is None


def test_reduction_dtypes_from_hlo() -> None:
    hlo = ("  %all-reduce.1 = f32[128,512]{1,0} all-reduce(f32[128,512]{1,0} %x), "
           "replica_groups={{0,1}}\n"
           "  %ar = (bf16[4]{0}, f32[2]{0}) all-reduce-start(bf16[4]{0} %a, f32[2]{0} %b)\n"
           "  %rs = f32[64]{0} reduce-scatter(f32[128]{0} %g), dimensions={0}\n"
           "  %ag = bf16[128]{0} all-gather(bf16[64]{0} %p), dimensions={0}\n")
    assert reduction_dtypes(hlo) == ["bfloat16", "float32"]
    assert reduction_dtypes(hlo.splitlines()[3]) == []  # an all-gather reduces nothing

"""Option axes (issue 27): `runner_options.<runner>.<option>: [a, b]` is one run per value, the
product of several on one runner; each value is checked as the option's, an error naming its
index; the run ids name the varying options and are unchanged without any; and runs of
different variants are never one configuration: grouping, summary.csv, the tables, compare and
the strategy table keep them apart under `deepspeed stage=3`. No framework (fast)."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.analysis.compare import compare
from bench.analysis.stats import summarise
from bench.catalog.registry import RUNNERS, Option
from bench.plan.config import ConfigError, load_config, validate
from bench.plan.runs import RunSpec, capacity_probe, expand, search_id
from bench.records import columns
from bench.records.grouping import config_key, group_key, runner_label, variant_of_id
from bench.records.store import record_path, write_json_atomic
from bench.report.summary import build_report, format_table
from bench.run.launch import base_record
from tests.helpers.cli import run_cli

BASE = {"runners": ["deepspeed", "torch_ddp"], "models": ["gpt2_tiny"], "devices": [1, 2],
        "batch_size_per_device": 4}
ENV = {"host": "h", "os": "Linux", "cpu_model": "cpu", "cpu_cores": 2, "memory_bytes": 2**33,
       "python": "3.11", "harness_commit": "abc", "gpus": [], "framework": {"torch": "2"}}


def plan(options: dict[str, Any], **more: Any) -> list[RunSpec]:
    return expand(validate({**BASE, "runner_options": options, **more}), "s")


# ---- the config -----------------------------------------------------------------------------

def test_a_list_is_an_axis_and_a_list_of_one_is_the_value() -> None:
    cfg = validate({**BASE, "runner_options": {"deepspeed": {"stage": [1, 3]}}})
    assert cfg.runner_options["deepspeed"]["stage"] == [1, 3]
    one = validate({**BASE, "runner_options": {"deepspeed": {"stage": [3]}}})
    plain = validate({**BASE, "runner_options": {"deepspeed": {"stage": 3}}})
    assert one.runner_options == plain.runner_options
    assert [r.run_id for r in expand(one, "s")] == [r.run_id for r in expand(plain, "s")]
    # the resolved config (config.yaml) loads back to the same plan
    again = validate(yaml.safe_load(yaml.safe_dump(cfg.to_dict())))
    assert [r.run_id for r in expand(again, "s")] == [r.run_id for r in expand(cfg, "s")]


@pytest.mark.parametrize("options, message", [
    ({"deepspeed": {"stage": [1, 4]}},
     "runner_options.deepspeed.stage[1]: 4 is not allowed; allowed: 1, 2, 3"),
    ({"deepspeed": {"stage": [1, True]}},  # True == 1, but no stage
     "runner_options.deepspeed.stage[1]: True is not allowed; allowed: 1, 2, 3"),
    ({"deepspeed": {"stage": True}},
     "runner_options.deepspeed.stage: True is not allowed; allowed: 1, 2, 3"),
    ({"deepspeed": {"stage": [[1]]}},
     "runner_options.deepspeed.stage[0]: [1] is not allowed; allowed: 1, 2, 3"),
    ({"torch_ddp": {"compile": [True, "yes"]}},
     "runner_options.torch_ddp.compile[1]: 'yes' is not allowed; allowed: bool"),
    ({"deepspeed": {"stage": []}},
     "runner_options.deepspeed.stage: [] is not allowed; allowed: 1, 2, 3, or a non-empty "
     "list of them (an option axis: a run for each)"),
    ({"deepspeed": {"stage": [3, 3]}},
     "runner_options.deepspeed.stage: 3 appears twice; list each value once"),
    ({"deepspeed": {"python": ["/usr/bin/python3", "/opt/py"]}},
     "runner_options.deepspeed.python: ['/usr/bin/python3', '/opt/py'] is not allowed; "
     "allowed: one value (str): python is the launcher's, the same for every run of the "
     "runner, and no option axis"),
    ({"deepspeed": {"python": []}},
     "runner_options.deepspeed.python: [] is not allowed; allowed: one value (str): python is "
     "the launcher's, the same for every run of the runner, and no option axis"),
])
def test_a_bad_option_list_is_one_line_naming_the_key_and_index(
        options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate({**BASE, "runner_options": options})
    assert str(err.value) == message


def test_values_alike_in_a_run_id_are_refused() -> None:
    """Two string values whose run id parts are one (a / reads as _) would plan one run id
    twice."""
    with pytest.raises(ConfigError) as err:
        validate({**BASE, "runners": ["tf_cnn_benchmarks"], "models": ["resnet50"],
                  "runner_options": {"tf_cnn_benchmarks": {"all_reduce_spec": ["a/b", "a_b"]}}})
    assert str(err.value).startswith(
        "runner_options.tf_cnn_benchmarks.all_reduce_spec[1]: 'a_b' is not allowed; allowed: "
        "values whose run id parts differ ('a/b' and this one are both "
        "'all_reduce_spec-a_b'")
    assert "\n" not in str(err.value)


def test_set_gives_an_axis_as_the_file_does(tmp_path: Path) -> None:
    path = tmp_path / "zero.yaml"
    path.write_text(yaml.safe_dump({**BASE, "runners": ["deepspeed"]}))
    given = load_config(path, ["runner_options.deepspeed.stage=[1,2,3]"])
    file = tmp_path / "zero-file.yaml"
    file.write_text(yaml.safe_dump({**BASE, "runners": ["deepspeed"],
                                    "runner_options": {"deepspeed": {"stage": [1, 2, 3]}}}))
    assert given.runner_options == load_config(file).runner_options
    assert [r.options["stage"] for r in expand(given, "s")] == [1, 1, 2, 2, 3, 3]
    with pytest.raises(ConfigError, match=r"^runner_options\.deepspeed\.stage\[2\]: 5 is not"):
        load_config(path, ["runner_options.deepspeed.stage=[1,2,5]"])


def test_the_cli_refuses_a_bad_axis_value_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "zero.yaml"
    path.write_text(yaml.safe_dump({**BASE, "runners": ["deepspeed"]}))
    proc = run_cli("--config", str(path), "--dry-run", "--set",
                   "runner_options.deepspeed.stage=[1,4]", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "runner_options.deepspeed.stage[1]: 4 is not allowed; allowed: 1, 2, 3")


def test_an_option_whose_own_type_is_a_list_takes_a_list_as_its_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    info = RUNNERS["deepspeed"]
    monkeypatch.setitem(RUNNERS, "deepspeed", dataclasses.replace(
        info, options={**info.options, "layers": Option(list, [])}))
    runs = plan({"deepspeed": {"layers": [1, 2]}}, runners=["deepspeed"])
    assert [r.options["layers"] for r in runs] == [[1, 2], [1, 2]]
    assert [r.run_id for r in runs] == [f"deepspeed__gpt2_tiny__n{n}__b4__synthetic__fp32__r0"
                                        for n in (1, 2)]


# ---- the plan -------------------------------------------------------------------------------

def test_each_combination_is_a_run_its_id_naming_the_varying_options() -> None:
    runs = plan({"deepspeed": {"stage": [1, 3]},
                 "torch_ddp": {"compile": [False, True], "backend": ["gloo", "auto"]}})
    ids = [r.run_id for r in runs if r.num_devices == 1]
    assert ids == [
        "deepspeed__gpt2_tiny__n1__b4__synthetic__fp32__stage-1__r0",
        "deepspeed__gpt2_tiny__n1__b4__synthetic__fp32__stage-3__r0",
        "torch_ddp__gpt2_tiny__n1__b4__synthetic__fp32__compile-false__backend-gloo__r0",
        "torch_ddp__gpt2_tiny__n1__b4__synthetic__fp32__compile-false__backend-auto__r0",
        "torch_ddp__gpt2_tiny__n1__b4__synthetic__fp32__compile-true__backend-gloo__r0",
        "torch_ddp__gpt2_tiny__n1__b4__synthetic__fp32__compile-true__backend-auto__r0",
    ]
    assert len({r.run_id for r in runs}) == len(runs) == 12
    for run in runs:  # each run holds its own value, and its variant reads back from its id
        assert run.variant == {k: run.options[k] for k in run.variant}
        assert RunSpec(**run.to_dict()).variant == run.variant  # the SLURM job's spec.json
    assert {tuple(r.variant.items()) for r in runs if r.runner == "torch_ddp"} == {
        (("compile", c), ("backend", b)) for c in (False, True) for b in ("gloo", "auto")}
    assert len({r.group_key for r in runs}) == 6  # device counts aside


def test_ids_are_unchanged_without_an_axis() -> None:
    runs = plan({"deepspeed": {"stage": 3}}, repeats=2)
    assert [r.run_id for r in runs][:2] == [
        "deepspeed__gpt2_tiny__n1__b4__synthetic__fp32__r0",
        "deepspeed__gpt2_tiny__n2__b4__synthetic__fp32__r0"]
    assert all(r.variant == {} for r in runs)
    # a custom-looking model name or a data label never reads as an option
    assert variant_of_id("deepspeed__stage-3__n1__b4__real-w4__fp32__r0", {"stage": 3}) == {}


def test_capacity_searches_per_variant() -> None:
    runs = plan({"deepspeed": {"stage": [1, 3]}}, mode="capacity", device_memory="1GiB",
                batch_size_per_device=None, devices=[2])
    assert [search_id(r, "batch") for r in runs] == [
        "capacity__deepspeed__gpt2_tiny__n2__fp32__stage-1__batch",
        "capacity__deepspeed__gpt2_tiny__n2__fp32__stage-3__batch",
        "capacity__torch_ddp__gpt2_tiny__n2__fp32__batch"]
    probe = capacity_probe(runs[1], "batch", 48)
    assert probe.run_id == "capacity__deepspeed__gpt2_tiny__n2__fp32__stage-3__batch48"
    assert probe.variant == {"stage": 3} and probe.options["stage"] == 3


# ---- grouping, tables, compare --------------------------------------------------------------

def records(tmp_path: Path, ips: dict[int, float]) -> list[dict[str, Any]]:
    """ok records of a stage axis at 1 and 2 devices, two repeats, as the launcher starts
    them (base_record)."""
    out = []
    for spec in plan({"deepspeed": {"stage": [1, 2, 3]}}, runners=["deepspeed"], repeats=2):
        rec = base_record(spec, ENV, tmp_path / "x.log")
        rate = ips[spec.options["stage"]] * spec.num_devices + spec.repeat
        rec.update(status="ok", images_per_sec=rate, step_times_s=[0.1] * 5)
        out.append(rec)
    return out


def test_variants_are_never_one_configuration(tmp_path: Path) -> None:
    recs = records(tmp_path, {1: 100.0, 2: 200.0, 3: 300.0})
    assert [r["variant"] for r in recs[:2]] == [{"stage": 1}, {"stage": 1}]
    for rec in recs:
        spec_key = [s for s in plan({"deepspeed": {"stage": [1, 2, 3]}}, runners=["deepspeed"])
                    if s.run_id == rec["run_id"].replace("__r1", "__r0")][0].group_key
        assert group_key(rec) == spec_key
    rows = summarise(recs)
    assert [(runner_label(r), r["num_devices"], r["images_per_sec"]) for r in rows] == [
        ("deepspeed stage=1", 1, 100.5), ("deepspeed stage=1", 2, 200.5),
        ("deepspeed stage=2", 1, 200.5), ("deepspeed stage=2", 2, 400.5),
        ("deepspeed stage=3", 1, 300.5), ("deepspeed stage=3", 2, 600.5)]
    one = {r["variant"]: r["images_per_sec"] for r in rows if r["num_devices"] == 1}
    for row in rows:  # each variant's speedup is over its own 1-device row
        assert row["speedup"] == pytest.approx(row["images_per_sec"] / one[row["variant"]])
    assert {config_key(r) for r in rows} == {config_key(r) for r in recs}
    # an older record (no variant) groups as before: by its runner alone
    old = [{k: v for k, v in r.items() if k != "variant"} for r in recs]
    assert len(summarise(old)) == 2
    table = format_table(rows)
    assert "deepspeed stage=3" in table and "deepspeed stage=1" in table


def test_summary_csv_report_and_strategies_name_the_variant(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    for rec in records(tmp_path, {1: 100.0, 2: 200.0, 3: 300.0}):
        write_json_atomic(record_path(out, rec["run_id"]), rec)
    build_report(out)
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [(r["runner"], r["variant"], r["num_devices"]) for r in rows] == [
        ("deepspeed", f"stage={s}", str(n)) for s in (1, 2, 3) for n in (1, 2)]
    assert "variant" in columns.keys("csv")
    page = (out / "report.html").read_text()
    assert "deepspeed stage=2" in page
    strategies = list(csv.DictReader((out / "strategies.csv").open()))
    assert sorted((r["num_devices"], r["strategy"]) for r in strategies) == [
        (str(n), f"deepspeed stage={s}") for n in (1, 2) for s in (1, 2, 3)]


def test_compare_pairs_each_variant_with_its_own(tmp_path: Path) -> None:
    base, new = tmp_path / "base", tmp_path / "new"
    for folder, ips in ((base, {1: 100.0, 2: 200.0, 3: 300.0}),
                        (new, {1: 100.0, 2: 200.0, 3: 150.0})):  # stage 3 halved
        for rec in records(tmp_path, ips):
            write_json_atomic(record_path(folder, rec["run_id"]), rec)
    cmp = compare(str(base), str(new), 0.05)
    verdicts = {row.label: row.verdict for row in cmp.rows}
    assert len(verdicts) == 6
    slower = sorted(label for label, v in verdicts.items() if v == "regression")
    assert slower and all(label.startswith("deepspeed stage=3 ") for label in slower)
    assert all(v != "regression" for label, v in verdicts.items()
               if not label.startswith("deepspeed stage=3 "))

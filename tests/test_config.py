"""Config validation: every bad input is one clear line naming key, value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.plan.config import KEYS, ConfigError, apply_override, load_config, parse_yaml, validate
from tests.helpers.cli import REPO, main_here, run_cli

BASE = {
    "runners": ["tf_mirrored"], "models": ["minigooglenet"], "devices": [1, 2],
    "batch_size_per_device": 32,
}


def bad(**changes: object) -> str:
    raw = {**BASE, **changes}
    raw = {k: v for k, v in raw.items() if v is not ...}
    with pytest.raises(ConfigError) as info:
        validate(raw)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_valid_config_fills_defaults() -> None:
    cfg = validate(dict(BASE))
    assert cfg.scaling == "weak" and cfg.batch_sizes == [32]
    assert cfg.data == ["synthetic"] and cfg.precision == ["fp32"] and cfg.device == "cpu"
    assert cfg.runner_options["tf_mirrored"]["xla"] is False


def test_scalars_become_lists() -> None:
    cfg = validate({**BASE, "runners": "tf_mirrored", "devices": 2, "precision": "bf16"})
    assert cfg.runners == ["tf_mirrored"] and cfg.devices == [2] and cfg.precision == ["bf16"]


@pytest.mark.parametrize("changes, words", [
    ({"runners": ["tf_mirored"]}, ["runners", "'tf_mirored'", "did you mean 'tf_mirrored'",
                                   "allowed: "]),
    ({"models": ["resnet51"]}, ["models", "'resnet51'", "resnet50", "minigooglenet"]),
    ({"devices": [0, 2]}, ["devices", "0", "an integer >= 1"]),
    ({"devices": ["two"]}, ["devices", "'two'", "integer"]),
    ({"devices": [True]}, ["devices", "True", "integer"]),
    ({"measure_steps": "10"}, ["measure_steps", "'10'", "integer"]),
    ({"measure_step": 10}, ["unknown key 'measure_step'", "did you mean 'measure_steps'"]),
    ({"scaling": "strong"}, ["batch_size_per_device", "global_batch_size"]),
    ({"batch_size_per_device": ..., "global_batch_size": 33}, ["global_batch_size", "33",
                                                                "does not divide by 2"]),
    ({"global_batch_size": 64}, ["both given", "exactly one"]),
    ({"batch_size_per_device": ...}, ["batch_size_per_device", "missing"]),
    ({"device": "tpu"}, ["device", "'tpu'", "cpu, gpu"]),
    ({"precision": ["fp8"]}, ["precision", "'fp8'", "fp32, tf32, bf16, fp16"]),
    ({"data": "imagenet"}, ["data", "'imagenet'", "synthetic"]),
    ({"timeout_s": -1}, ["timeout_s", "-1", "> 0"]),
    ({"runners": []}, ["runners", "[]", "non-empty"]),
    ({"runner_options": {"tf_mirrored": {"xla": "yes"}}},
     ["runner_options.tf_mirrored.xla", "'yes'", "bool"]),
    ({"runner_options": {"tf_mirrored": {"xal": True}}}, ["'xal'", "did you mean 'xla'"]),
    ({"runner_options": {"tf_mirrored": {"data_format": "nchw"}}},
     ["data_format", "'nchw'", "channels_last, channels_first"]),
    ({"runner_options": {"nope": {}}}, ["runner_options", "'nope'", "tf_mirrored"]),
])
def test_bad_values_name_key_value_and_allowed(changes: dict, words: list[str]) -> None:
    message = bad(**changes)
    for word in words:
        assert word in message, (word, message)


def test_missing_required_key() -> None:
    raw = dict(BASE)
    del raw["models"]
    with pytest.raises(ConfigError, match="models: missing"):
        validate(raw)


def test_strong_scaling_divides_global_batch() -> None:
    cfg = validate({**{k: v for k, v in BASE.items() if k != "batch_size_per_device"},
                    "global_batch_size": 64, "devices": [1, 2, 4]})
    assert cfg.scaling == "strong" and cfg.batch_sizes == [64]


def test_set_parses_yaml_and_reaches_nested_keys() -> None:
    raw = dict(BASE)
    apply_override(raw, "devices=[1,2,4]")
    apply_override(raw, "runner_options.tf_mirrored.xla=true")
    apply_override(raw, "name=my-sweep")
    cfg = validate(raw)
    assert cfg.devices == [1, 2, 4] and cfg.name == "my-sweep"
    assert cfg.runner_options["tf_mirrored"]["xla"] is True


def test_set_without_equals_is_an_error() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        apply_override({}, "devices")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_malformed_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("runners: [tf_mirrored\nmodels: x\n")
    with pytest.raises(ConfigError, match="not valid YAML .*line"):
        load_config(path)


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(path)


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_configs_validate(name: str, request: pytest.FixtureRequest) -> None:
    path = REPO / "configs" / f"{name}.yaml"
    # a real-data config names a dataset the user makes first: point it at the test one
    raw = yaml.safe_load(path.read_text())
    fixture = "digits_dataset" if raw.get("mode") == "converge" else "real_dataset"
    sets = ([f"dataset.path={request.getfixturevalue(fixture)}"] if "dataset" in raw else [])
    cfg = load_config(path, sets)
    assert cfg.name == name
    # the resolved config loads back to the same thing
    assert validate(cfg.to_dict()).to_dict() == cfg.to_dict()


@pytest.mark.parametrize("content, args, words", [
    ("runners: [nope]\nmodels: [minigooglenet]\ndevices: [1]\nbatch_size_per_device: 8\n", [],
     ["runners", "'nope'"]),
    ("runners: [tf_mirrored\n", [], ["not valid YAML"]),
    (None, [], ["does not exist"]),
    ("runners: [tf_mirrored]\nmodels: [minigooglenet]\ndevices: [1]\nbatch_size_per_device: 8\n",
     ["--set", "devices=[0]"], ["devices", "0"]),
])
def test_cli_bad_config_is_one_line_exit_2(tmp_path: Path, content: str | None, args: list[str],
                                           words: list[str]) -> None:
    path = tmp_path / "c.yaml"
    if content is not None:
        path.write_text(content)
    cli = run_cli if content is None else main_here  # one case through the real CLI
    proc = cli("--config", str(path), "--dry-run", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for word in words:
        assert word in lines[0]


def test_dry_run_prints_plan_table() -> None:
    proc = run_cli("--config", "configs/dgx1.yaml", "--dry-run", "--set", "repeats=1",
                   timeout=60)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load((REPO / "configs" / "dgx1.yaml").read_text())
    runs = len(cfg["runners"]) * len(cfg["models"]) * len(cfg["devices"])
    assert runs >= 9 * 2 * 4 and f"{runs} runs" in proc.stdout
    assert "tf_mirrored__resnet50__n8__b64__synthetic__fp32__r0" in proc.stdout
    assert yaml.safe_load((REPO / "configs" / "dgx1.yaml").read_text())["devices"] == [1, 2, 4, 8]


def test_real_data_needs_a_prepared_dataset(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^dataset: None is not allowed; allowed: a mapping"):
        validate({**BASE, "data": ["synthetic", "real"]})
    with pytest.raises(ConfigError, match="^dataset.path: .* has no manifest.json"):
        validate({**BASE, "data": "real", "dataset": {"path": str(tmp_path)}})
    (tmp_path / "manifest.json").write_text('{"classes": 10}')
    for key, value, words in [("augmentation", "mixup", "none, crop-flip"),
                              ("workers", -1, "an integer >= 0"),
                              ("workers", [1, "x"], "an integer >= 0 or a list"),
                              ("nope", 1, "keys path")]:
        with pytest.raises(ConfigError, match=f"^dataset.{key}: .*{words}"):
            validate({**BASE, "data": "real", "dataset": {"path": str(tmp_path), key: value}})
    cfg = validate({**BASE, "data": ["synthetic", "real"], "dataset": {"path": str(tmp_path)}})
    assert cfg.dataset == {"path": str(tmp_path.resolve()), "augmentation": "crop-flip",
                           "workers": [4]}
    assert validate(cfg.to_dict()).to_dict() == cfg.to_dict()


def test_real_runs_carry_the_dataset_and_dotted_set_reaches_it(tmp_path: Path) -> None:
    from bench.plan.runs import expand

    (tmp_path / "manifest.json").write_text('{"classes": 10}')
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "data": ["synthetic", "real"]}))
    cfg = load_config(path, [f"dataset.path={tmp_path}", "dataset.workers=2"])
    runs = expand(cfg, "s")
    assert {r.data: r.dataset for r in runs} == {
        "synthetic": None,
        "real": {"path": str(tmp_path.resolve()), "augmentation": "crop-flip", "workers": 2}}
    assert {r.data_label for r in runs} == {"synthetic", "real-w2"}


def test_a_dataset_with_more_classes_than_the_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"classes": 11}')
    raw = {**BASE, "models": ["minigooglenet"], "data": "real",
           "dataset": {"path": str(tmp_path)}}
    with pytest.raises(ConfigError, match="^dataset.path: .*at most 10 classes for model "
                       "minigooglenet \\(this one has 11\\)"):
        validate(raw)
    assert validate({**raw, "models": ["resnet50"]}).models == ["resnet50"]


def test_pipeline_mode_needs_a_dataset_and_names_real_pipelines(tmp_path: Path) -> None:
    from bench.catalog.registry import PIPELINES

    (tmp_path / "manifest.json").write_text('{"classes": 10}')
    with pytest.raises(ConfigError, match="^dataset: None .* when mode includes pipeline"):
        validate({"models": ["minigooglenet"], "mode": "pipeline",
                  "batch_size_per_device": 8})
    with pytest.raises(ConfigError, match="^mode: 'pipelines' is not allowed .*did you mean "
                       "'pipeline'"):
        validate({**BASE, "mode": "pipelines"})
    with pytest.raises(ConfigError, match="^pipelines: 'tf.data' is not allowed .*did you "
                       "mean 'tf_data'"):
        validate({**BASE, "mode": "pipeline", "pipelines": ["tf.data"],
                  "dataset": {"path": str(tmp_path)}})
    # pipeline-only: no runners or devices needed; every pipeline unless named
    cfg = validate({"models": ["minigooglenet"], "mode": "pipeline",
                    "batch_size_per_device": 8, "dataset": {"path": str(tmp_path)}})
    assert cfg.pipelines == list(PIPELINES) and cfg.runners == []
    assert validate(cfg.to_dict()).to_dict() == cfg.to_dict()


def test_pipeline_runs_cover_pipelines_models_batches_and_worker_counts(tmp_path: Path) -> None:
    from bench.plan.runs import expand

    (tmp_path / "manifest.json").write_text('{"classes": 10}')
    cfg = validate({**BASE, "mode": ["pipeline", "benchmark"], "data": ["synthetic", "real"],
                    "pipelines": ["pil_loop", "tf_data"],
                    "dataset": {"path": str(tmp_path), "workers": [1, 4]}})
    runs = expand(cfg, "s")
    pipes = [r for r in runs if r.mode == "pipeline"]
    # the naive baseline has no workers: it runs once, with 0
    assert [(r.runner, r.dataset["workers"]) for r in pipes] == [
        ("pil_loop", 0), ("tf_data", 1), ("tf_data", 4)]
    assert pipes[0].run_id == "pipeline__pil_loop__minigooglenet__b32__real-w0__r0"
    assert pipes[0].family == "harness" and pipes[1].module == "runners.tf.pipeline"
    bench = [r for r in runs if r.mode == "benchmark"]
    # synthetic once per device count; real once per worker count and device count
    assert sorted(r.data_label for r in bench) == sorted(
        ["synthetic", "real-w1", "real-w4"] * len(BASE["devices"]))
    assert len({r.run_id for r in runs}) == len(runs)
    assert runs[: len(pipes)] == pipes
    assert {r.measure_steps for r in pipes} == {200} and bench[0].measure_steps == 20
    assert validate({**BASE, "pipeline_steps": 50}).pipeline_steps == 50
    with pytest.raises(ConfigError, match="^pipeline_steps: 0 is not allowed"):
        validate({**BASE, "pipeline_steps": 0})


def test_until_stable_and_telemetry_defaults() -> None:
    cfg = validate(dict(BASE))
    assert cfg.until_stable is None
    assert cfg.telemetry == {"enabled": True, "interval_s": 0.25, "starved_below_pct": 50.0}
    cfg = validate({**BASE, "repeats": 3, "until_stable": {"target_cv": 0.03},
                    "telemetry": {"interval_s": 1, "starved_below_pct": 70}})
    assert cfg.until_stable == {"target_cv": 0.03, "max_repeats": 10}
    assert cfg.telemetry["interval_s"] == 1.0 and cfg.telemetry["starved_below_pct"] == 70.0
    assert validate({**BASE, "telemetry": False}).telemetry["enabled"] is False
    assert validate(cfg.to_dict()).until_stable == cfg.until_stable


@pytest.mark.parametrize(("changes", "words"), [
    ({"repeats": 1, "until_stable": {"target_cv": 0.02}}, "repeats: 1 is not allowed"),
    ({"repeats": 3, "until_stable": {"target_cv": 2}}, "until_stable.target_cv: 2"),
    ({"repeats": 3, "until_stable": {"cv": 0.1}}, "until_stable.cv: 0.1 is not allowed"),
    ({"repeats": 3, "until_stable": {"max_repeats": 2}}, "until_stable.max_repeats: 2"),
    ({"until_stable": "yes"}, "until_stable: 'yes'"),
    ({"telemetry": {"interval_s": 0}}, "telemetry.interval_s: 0 is not allowed"),
    ({"telemetry": {"starved_below_pct": 120}}, "telemetry.starved_below_pct: 120"),
    ({"telemetry": {"gpu": True}}, "telemetry.gpu: True is not allowed"),
    ({"telemetry": "on"}, "telemetry: 'on'"),
])
def test_bad_until_stable_and_telemetry(changes: dict, words: str) -> None:
    assert words in bad(**changes)


def test_runs_carry_the_telemetry_settings_unless_off() -> None:
    from bench.plan.runs import another_repeat, config_id, expand

    runs = expand(validate({**BASE, "telemetry": {"interval_s": 0.5}}), "s")
    assert runs[0].telemetry == {"enabled": True, "interval_s": 0.5, "starved_below_pct": 50.0}
    assert expand(validate({**BASE, "telemetry": False}), "s")[0].telemetry is None
    extra = another_repeat(runs[0], 7)
    assert extra.repeat == 7 and extra.run_id.endswith("__r7")
    assert config_id(extra.run_id) == config_id(runs[0].run_id)


# A key whose value may be a list (an axis of the sweep), a valid list for it, and the message
# when its first value is listed twice. Every other key refuses a list (checked below), so a
# list key added to the config without a duplicate check fails these tests.
LIST_KEYS = {
    "runners": (["tf_mirrored", "torch_ddp"], "'tf_mirrored'"),
    "models": (["minigooglenet", "resnet50"], "'minigooglenet'"),
    "devices": ([1, 2], "1"),
    "batch_size_per_device": ([16, 32], "16"),
    "global_batch_size": ([64, 128], "64"),
    "data": (["synthetic", "real"], "'synthetic'"),
    "precision": (["fp32", "bf16"], "'fp32'"),
    "mode": (["benchmark", "pipeline"], "'benchmark'"),
    "pipelines": (["pil_loop", "tf_data"], "'pil_loop'"),
    "probes": (["torch_allreduce", "tf_allreduce"], "'torch_allreduce'"),
    "dataset.workers": ([1, 2], "1"),
    "nodes": ([1, 2], "1"),
}


def _with(raw: dict, key: str, value: object) -> dict:
    """raw with a dotted key set (a copy)."""
    raw = yaml.safe_load(yaml.safe_dump(raw))
    *parents, last = key.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    if key == "global_batch_size":
        del raw["batch_size_per_device"]
    return raw


@pytest.fixture()
def real_base(tmp_path: Path) -> dict:
    """BASE on real data, in both modes, with a prepared-looking dataset."""
    (tmp_path / "manifest.json").write_text('{"classes": 10}')
    return {**BASE, "data": ["synthetic", "real"], "mode": ["benchmark", "pipeline"],
            "dataset": {"path": str(tmp_path)}, "repeats": 2}


@pytest.mark.parametrize("key", sorted(LIST_KEYS))
def test_a_value_listed_twice_is_refused(key: str, real_base: dict) -> None:
    values, shown = LIST_KEYS[key]
    if key == "nodes":  # more than one node is a SLURM sweep's
        real_base = {**real_base, "cluster": {"backend": "slurm"}}
    assert validate(_with(real_base, key, values))  # the list itself is fine
    for repeated, times in ([values[0], values[1], values[0]], "twice"), (
            [values[0]] * 3, "3 times"):
        with pytest.raises(ConfigError) as info:
            validate(_with(real_base, key, repeated))
        assert str(info.value) == f"{key}: {shown} appears {times}; list each value once"


@pytest.mark.parametrize("key, value", [
    ("name", "x"), ("description", "d"), ("scaling", "weak"), ("device", "cpu"),
    ("warmup_steps", 1), ("measure_steps", 1), ("repeats", 2), ("timeout_s", 60),
    ("runner_options", {}), ("dataset", {"path": "."}), ("pipeline_steps", 10),
    ("until_stable", {"target_cv": 0.05}), ("telemetry", {}), ("cluster", {"backend": "local"}),
    ("device_memory", "1GiB"), ("scale", "batch"), ("capacity", {"start": 2}),
    ("converge", {"max_epochs": 2}),
])
def test_keys_that_are_no_axis_refuse_a_list(key: str, value: object, real_base: dict) -> None:
    assert set(KEYS) == {k.split(".")[0] for k in LIST_KEYS} | {
        "name", "description", "scaling", "device", "warmup_steps", "measure_steps", "repeats",
        "timeout_s", "runner_options", "dataset", "pipeline_steps", "until_stable",
        "telemetry", "cluster", "device_memory", "scale", "capacity", "converge"}, \
        "a new key: add it to LIST_KEYS or to this test"
    # the last three: mode capacity's and mode converge's
    if key not in ("dataset", "device_memory", "capacity", "converge"):
        validate(_with(real_base, key, value))
    with pytest.raises(ConfigError, match=f"^{key}: "):
        validate(_with(real_base, key, [value]))


def test_a_run_listed_twice_is_refused_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "runners": ["tf_mirrored", "tf_mirrored"]}))
    proc = run_cli("--config", str(path), "--dry-run", timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == ("error: runners: 'tf_mirrored' appears twice; list each value "
                           "once\n")
    # a --set that repeats a value is refused the same way (the same command, in this process)
    proc = main_here("--config", "configs/cpu-smoke.yaml", "--dry-run", "--set", "devices=[2,2]")
    assert proc.returncode == 2
    assert proc.stderr == "error: devices: 2 appears twice; list each value once\n"


SMOKE_TEXT = (REPO / "configs" / "cpu-smoke.yaml").read_text()


@pytest.mark.parametrize("text, key, line, first", [
    # a second runners: line (PyYAML alone keeps the last one)
    (SMOKE_TEXT + "runners: [torch_ddp]\n", "runners", SMOKE_TEXT.count("\n") + 1, 5),
    # a runner named twice under runner_options
    (SMOKE_TEXT + "runner_options:\n  tf_mirrored: {xla: true}\n  tf_mirrored: {}\n",
     "tf_mirrored", SMOKE_TEXT.count("\n") + 3, SMOKE_TEXT.count("\n") + 2),
    # an option twice, two levels down
    (SMOKE_TEXT + "runner_options:\n  tf_mirrored:\n    xla: true\n    xla: false\n",
     "xla", SMOKE_TEXT.count("\n") + 4, SMOKE_TEXT.count("\n") + 3),
    # in a flow mapping, on one line
    (SMOKE_TEXT + "telemetry: {interval_s: 1, interval_s: 2}\n", "interval_s",
     SMOKE_TEXT.count("\n") + 1, SMOKE_TEXT.count("\n") + 1),
], ids=["top-level", "runner-under-runner_options", "runner-option", "flow-mapping"])
def test_a_key_given_twice_is_refused_with_its_line(tmp_path: Path, text: str, key: str,
                                                     line: int, first: int) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (f"--config: {str(path)!r}: key {key!r} at line {line} appears "
                               f"twice (first at line {first}); give each key once")


def test_a_key_given_twice_in_a_set_value_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--set telemetry: .*key 'interval_s' at line 1 "
                       "appears twice"):
        apply_override({}, "telemetry={interval_s: 1, interval_s: 2}")


def test_yaml_merge_keys_may_still_override_and_the_loader_stays_safe() -> None:
    # `<<: *base` then one of its keys: YAML's override, not a key given twice
    doc = parse_yaml("base: &b {xla: true, data_format: channels_last}\n"
                     "over: {<<: *b, xla: false}\n", "m")
    assert doc["over"] == {"xla": False, "data_format": "channels_last"}
    with pytest.raises(ConfigError, match="^m is not valid YAML .*could not determine a "
                       "constructor for the tag 'tag:yaml.org,2002:python/object/apply:os"):
        parse_yaml("x: !!python/object/apply:os.getcwd []\n", "m")


def test_runner_options_typo_names_the_closest_runner_of_the_sweep() -> None:
    message = bad(runners=["tf_mirrored", "torch_ddp"],
                  runner_options={"tf_mirored": {"xla": True}})
    assert message == ("runner_options: 'tf_mirored' is not a runner (did you mean "
                       "'tf_mirrored'?); allowed: this sweep's runners: tf_mirrored, torch_ddp")


def test_runner_options_for_a_runner_outside_the_sweep_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"classes": 10}')
    message = bad(runner_options={"torch_ddp": {"backend": "gloo"}})
    assert message == ("runner_options: 'torch_ddp' is not one of this sweep's runners; "
                       "allowed: tf_mirrored (add torch_ddp to runners, or remove its options)")
    # a pipeline-only sweep has no runners, so no runner options
    with pytest.raises(ConfigError, match="^runner_options: 'tf_mirrored' is not one of this "
                       r"sweep's runners; allowed: none \(this sweep has no runners\)"):
        validate({"models": ["minigooglenet"], "mode": "pipeline", "batch_size_per_device": 8,
                  "runner_options": {"tf_mirrored": {}}, "pipelines": ["pil_loop"],
                  "dataset": {"path": str(tmp_path)}})


def test_narrowing_runners_with_set_drops_the_files_options_with_a_note(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "runner_options": {"tf_mirrored": {"xla": True}}}))
    # --set runners replaces the list the file's options were written for
    assert list(load_config(path, ["runners=[torch_ddp]"]).runner_options) == ["torch_ddp"]
    assert ("note: runner_options.tf_mirrored not used: --set runners left tf_mirrored out"
            in capsys.readouterr().err)
    # an option --set gives a runner the sweep lacks is still refused, unless --set adds it
    with pytest.raises(ConfigError, match="^runner_options: 'torch_ddp' is not one"):
        load_config(path, ["runner_options.torch_ddp.python=/x/py"])
    cfg = load_config(path, ["runner_options.torch_ddp.python=/x/py",
                             "runners=[tf_mirrored, torch_ddp]"])
    assert cfg.runner_options["torch_ddp"]["python"] == "/x/py"
    assert cfg.runner_options["tf_mirrored"]["xla"] is True
    proc = run_cli("--config", str(path), "--dry-run", "--set", "runner_options.tf_mirored.xla=1",
                   timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert "'tf_mirored'" in proc.stderr and "did you mean 'tf_mirrored'" in proc.stderr


@pytest.mark.parametrize("text, words", [
    # each of these once ended in a traceback instead of a one-line error
    ("name: 2024-13-01", "cannot read '2024-13-01' as timestamp"),
    ("description: !!bool maybe", "cannot read 'maybe' as bool"),
    ("description: !!timestamp 1", "cannot read '1' as timestamp"),
    ("warmup_steps: " + "1" * 5000, "as int (ValueError: Exceeds the limit"),
    ("warmup_steps: 0x" + "f" * 5000, "warmup_steps: <int too large to show> is not allowed"),
    ("description: " + "[" * 5000 + "]" * 5000, "allowed: YAML nested at most 32 levels deep"),
    ("scaling: [weak]", "scaling: ['weak'] is not allowed; allowed: one of weak, strong (one "
     "value for the whole sweep)"),
    ("name: \"a\\tb\"", "name: 'a\\tb' is not allowed; allowed: a non-empty string of printable"),
    ("timeout_s: .inf", "timeout_s: inf is not allowed"),
    ("timeout_s: .nan", "timeout_s: nan is not allowed"),
    ("repeats: 1000000000", "repeats: 1000000000 is not allowed; allowed: an integer from 1 "
     "to 1000"),
    ("data: real\ndataset: {path: ~nosuchuser/data}", "dataset.path: '~nosuchuser/data' is not "
     "allowed"),
    ("data: real\ndataset: {path: \"a\\0b\"}", "dataset.path: 'a\\x00b' is not allowed"),
    ("data: real\ndataset: {path: " + "x" * 5000 + "}", "dataset.path: 'xxxx"),
    ("telemetry: {\"a\\nb\": 1}", "telemetry['a\\nb']: 1 is not allowed"),
], ids=lambda v: v[:30] if isinstance(v, str) else None)
def test_odd_values_end_in_one_line_errors(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(BASE) + text + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert words in str(info.value) and len(str(info.value).splitlines()) == 1


def test_odd_set_keys_and_files_end_in_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(REPO / "configs" / "cpu-smoke.yaml", ["a\nb=\x1f"])
    assert str(info.value).startswith("--set 'a\\nb': '\\x1f' is not valid YAML")
    path = tmp_path / "latin1.yaml"
    path.write_bytes(SMOKE_TEXT.encode() + b"description: caf\xe9\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(path)


def test_more_than_one_node_needs_the_slurm_backend() -> None:
    with pytest.raises(ConfigError) as info:
        validate({**BASE, "nodes": [1, 2]})
    assert str(info.value).startswith("nodes: [1, 2] is not allowed; allowed: [1] unless "
                                      "cluster.backend is slurm")
    cfg = validate({**BASE, "nodes": [1, 2], "cluster": {"backend": "slurm", "max_jobs": 2}})
    assert cfg.nodes == [1, 2] and cfg.cluster["backend"] == "slurm"
    assert cfg.cluster["max_jobs"] == 2 and cfg.cluster["exclusive"] is True


@pytest.mark.parametrize("cluster, message", [
    ({"backend": "pbs"}, "cluster.backend: 'pbs' is not allowed; allowed: local, slurm"),
    ({"max_jobs": 0}, "cluster.max_jobs: 0 is not allowed; allowed: an integer >= 1"),
    ({"exclusive": "yes"}, "cluster.exclusive: 'yes' is not allowed; allowed: true or false"),
    ({"sbatch_args": "--qos=x"}, "cluster.sbatch_args: '--qos=x' is not allowed; allowed: a "
                                 "list of strings"),
    ({"queue": "x"}, "cluster.queue: 'x' is not allowed; allowed: keys backend, partition, "),
])
def test_bad_cluster_keys_name_key_value_and_what_is_allowed(cluster: dict, message: str
                                                             ) -> None:
    with pytest.raises(ConfigError) as info:
        validate({**BASE, "cluster": cluster})
    assert str(info.value).startswith(message)


def test_strong_scaling_divides_by_the_devices_of_all_nodes() -> None:
    raw = {**BASE, "nodes": [1, 3], "devices": [2], "cluster": {"backend": "slurm"}}
    raw.pop("batch_size_per_device", None)
    with pytest.raises(ConfigError, match=r"^global_batch_size: 8 does not divide by 6 devices"):
        validate({**raw, "global_batch_size": 8, "scaling": "strong"})
    assert validate({**raw, "global_batch_size": 12, "scaling": "strong"}).batch_sizes == [12]


def test_until_stable_is_refused_on_slurm() -> None:
    with pytest.raises(ConfigError, match=r"^until_stable: .* allowed: nothing with cluster"):
        validate({**BASE, "repeats": 2, "until_stable": {"target_cv": 0.05},
                  "cluster": {"backend": "slurm"}})

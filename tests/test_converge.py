"""Mode converge without a framework (issue 28): the recipe's learning rates, the batches each
process gets, the augmentation, the loop's stopping and timing (driven by a numpy softmax
regression that really learns digits), the parent's check of a converge result, the config's
rules and the dry run's reasons."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from bench.plan.config import load_config
from bench.plan.runs import expand
from bench.run.sweep import precheck
from bench.run.verdict import validate_converge
from contract.spec import spec_for
from runners import converge as cv
from tests.helpers.cli import main_here, run_cli

RECIPE = dict(target_accuracy=0.9, max_epochs=10, optimizer="sgd", momentum=0.9,
              weight_decay=0.0, base_lr=0.01, reference_batch=32, lr_scaling="none",
              warmup_epochs=0.0, schedule="poly", poly_power=1.0, step_epochs=30,
              step_gamma=0.1, last_batch="drop", augmentation="none", seed=0)


def spec(dataset: Path | None = None, batch: int = 32, **recipe: object):
    return spec_for(mode="converge", converge={**RECIPE, **recipe}, model="small_cnn",
                    global_batch_size=batch, batch_size_per_device=batch,
                    dataset={"path": str(dataset or "/nonexistent"), "augmentation": "none",
                             "workers": 0})


# ---- the recipe ----

def test_poly_is_seed_004s_poly_decay_set_each_epoch() -> None:
    r = cv.Recipe.of(spec(max_epochs=70, base_lr=5e-3, reference_batch=64, batch=256))
    for epoch in (0, 1, 35, 69):
        seed_004 = 5e-3 * (1 - epoch / 70.0) ** 1.0  # PyImageSearch's poly_decay(epoch)
        assert r.lr(epoch, 0, 195) == pytest.approx(seed_004)
        assert r.lr(epoch, 194, 195) == pytest.approx(seed_004)  # constant within the epoch


def test_linear_scaling_with_warmup_ramps_per_step_from_base_to_scaled() -> None:
    r = cv.Recipe.of(spec(batch=256, lr_scaling="linear", warmup_epochs=2, schedule="constant"))
    assert r.peak_lr == pytest.approx(0.08)
    assert r.lr(0, 0, 10) == pytest.approx(0.01)
    assert r.lr(1, 0, 10) == pytest.approx(0.045)
    assert r.lr(1, 5, 10) == pytest.approx(0.0625)
    assert r.lr(2, 0, 10) == pytest.approx(0.08)
    assert cv.Recipe.of(spec(batch=128, lr_scaling="sqrt")).scale == pytest.approx(2.0)
    assert cv.Recipe.of(spec(batch=128, lr_scaling="none")).peak_lr == pytest.approx(0.01)


def test_cosine_and_step_schedules() -> None:
    cos = cv.Recipe.of(spec(schedule="cosine", max_epochs=4))
    assert [round(cos.lr(e, 0, 1), 6) for e in range(4)] == [
        round(0.01 * 0.5 * (1 + math.cos(math.pi * e / 4)), 6) for e in range(4)]
    step = cv.Recipe.of(spec(schedule="step", step_epochs=2, step_gamma=0.5))
    assert [step.lr(e, 0, 1) for e in range(5)] == pytest.approx(
        [0.01, 0.01, 0.005, 0.005, 0.0025])


# ---- the batches ----

def test_a_short_last_batch_is_dropped_padded_or_kept() -> None:
    n = 100
    drop = cv.epoch_indices(cv.Recipe.of(spec(batch=32)), n, 0)
    pad = cv.epoch_indices(cv.Recipe.of(spec(batch=32, last_batch="pad")), n, 0)
    keep = cv.epoch_indices(cv.Recipe.of(spec(batch=32, last_batch="keep")), n, 0)
    assert [len(b) for b in drop] == [32, 32, 32]
    assert [len(b) for b in pad] == [32, 32, 32, 32]
    assert [len(b) for b in keep] == [32, 32, 32, 4]
    # the same permutation under each; pad fills from the epoch's first indices
    assert all(np.array_equal(a, b) for a, b in zip(drop, pad[:3], strict=True))
    assert np.array_equal(pad[3], np.concatenate([keep[3], drop[0][:28]]))
    assert sorted(np.concatenate(keep).tolist()) == list(range(n))
    # each epoch its own order, the same for the same seed
    again = cv.epoch_indices(cv.Recipe.of(spec(batch=32)), n, 0)
    other = cv.epoch_indices(cv.Recipe.of(spec(batch=32)), n, 1)
    assert np.array_equal(drop[0], again[0]) and not np.array_equal(drop[0], other[0])


def _splits(n: int = 10) -> cv.Splits:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
    y = np.arange(n) % 3
    return cv.Splits(x, y, x[:3], y[:3], 3, x.astype(np.float32).mean(axis=0))


def test_ranks_share_each_global_batch_and_a_short_kept_one_leaves_a_rank_empty() -> None:
    splits = _splits(9)  # batch 4: two whole batches, a last one of 1 row
    recipe = cv.Recipe.of(spec(batch=4, last_batch="keep"))
    whole = cv.epoch_batches(recipe, splits, 0)
    ranks = [cv.epoch_batches(recipe, splits, 0, rank=r, world=2) for r in (0, 1)]
    assert len(whole) == len(ranks[0]) == len(ranks[1]) == 3
    for step, batch in enumerate(whole):
        joined = np.concatenate([ranks[0][step].x, ranks[1][step].x])
        assert np.array_equal(joined, batch.x)
        assert ranks[0][step].global_rows == batch.global_rows == len(batch.y)
    assert [len(r[2].y) for r in ranks] == [1, 0]  # seed 002: a device without data


def test_shift_flip_is_seeded_bounded_and_keeps_the_pixels() -> None:
    images = np.arange(2 * 10 * 10 * 1, dtype=np.uint8).reshape(2, 10, 10, 1)
    a = cv.augment(images, np.random.default_rng(1))
    b = cv.augment(images, np.random.default_rng(1))
    assert np.array_equal(a, b) and a.shape == images.shape
    for out, img in zip(a, images, strict=True):
        # a shift of at most 1 pixel (10%) each way, maybe flipped: every value comes from
        # the image and the centre 8x8 (or its mirror) is a shifted window of it
        assert set(out.ravel()) <= set(img.ravel())
        candidates = [img, img[:, ::-1]]
        windows = [np.pad(c, ((1, 1), (1, 1), (0, 0)), mode="edge")[dy:dy + 10, dx:dx + 10]
                   for c in candidates for dy in range(3) for dx in range(3)]
        assert any(np.array_equal(out, w) or np.array_equal(out, w[:, ::-1]) for w in windows)


# ---- the loop, on a numpy softmax regression that learns digits ----

class SoftmaxRegression:
    """Multinomial logistic regression trained by SGD with momentum, in numpy."""

    def __init__(self, features: int, classes: int, momentum: float) -> None:
        self.w = np.zeros((features, classes))
        self.v = np.zeros_like(self.w)
        self.momentum = momentum
        self.moving = np.zeros(features)  # a stand-in for BatchNorm's moving mean

    def train_epoch(self, epoch: int, batches: list[cv.Batch], lr_at) -> float:
        losses = []
        for step, b in enumerate(batches):
            x = b.x.reshape(len(b.y), self.w.shape[0])
            if len(x):
                self.moving = 0.9 * self.moving + 0.1 * x.mean(axis=0)
            else:  # what BatchNorm does with a tower that got no rows
                self.moving = 0.9 * self.moving + 0.1 * np.full(self.moving.shape, np.nan)
                continue
            z = x @ self.w
            p = np.exp(z - z.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            losses.append(-np.log(p[np.arange(len(b.y)), b.y] + 1e-12).mean())
            p[np.arange(len(b.y)), b.y] -= 1
            self.v = self.momentum * self.v + x.T @ p / len(b.y)
            self.w -= lr_at(step) * self.v
        return float(np.mean(losses))

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(((x.reshape(len(y), -1) @ self.w).argmax(axis=1) == y).mean())

    def moving_stats(self) -> tuple[bool, str]:
        finite = bool(np.isfinite(self.moving).all())
        return finite, "" if finite else "moving mean has NaN"


def train(dataset: Path, **recipe: object) -> dict:
    s = spec(dataset, **{"batch": 32, **recipe})
    model = SoftmaxRegression(32 * 32 * 3, 10, s.converge["momentum"])
    return cv.train_to_accuracy(s, model.train_epoch, model.evaluate, model.moving_stats)


def test_the_loop_stops_at_the_target_and_times_it(digits_dataset: Path) -> None:
    result = train(digits_dataset, target_accuracy=0.9, max_epochs=20, base_lr=0.001)
    curve = result["curve"]
    assert result["epochs_to_target"] == len(curve) < 20
    assert curve[-1]["accuracy"] >= 0.9 > max(p["accuracy"] for p in curve[:-1])
    assert result["time_to_target_s"] == curve[-1]["wall_s"]
    assert result["time_to_target_s"] >= result["train_time_s"] + result["eval_time_s"] - 0.01
    assert result["samples"] == sum(p["steps"] for p in curve) * 32
    assert result["target_reason"] is None and "status" not in result
    assert validate_converge(result) == []


def test_a_target_not_reached_says_why_and_has_no_time(digits_dataset: Path) -> None:
    result = train(digits_dataset, target_accuracy=1.0, max_epochs=2)
    assert result["epochs_run"] == 2 and result["time_to_target_s"] is None
    assert "< target 1.0 in max_epochs=2" in result["target_reason"]
    assert validate_converge(result) == []
    none = train(digits_dataset, target_accuracy=None, max_epochs=1)
    assert none["target_reason"].startswith("no target_accuracy set")


def test_non_finite_moving_statistics_make_the_run_invalid_with_its_curve(
        digits_dataset: Path) -> None:
    # 1,437 training images, global batch 2 x 359: a last batch of 1 row kept, split over 2
    # processes: rank 1 gets none (seed 002's trap)
    s = spec(digits_dataset, batch=718, last_batch="keep", max_epochs=3, target_accuracy=None)
    model = SoftmaxRegression(32 * 32 * 3, 10, 0.9)
    result = cv.train_to_accuracy(s, model.train_epoch, model.evaluate, model.moving_stats,
                                  rank=1, world=2)
    assert result["status"] == "invalid"
    assert "BatchNorm moving statistics are not finite after epoch 1" in result["reason"]
    assert result["moving_stats_finite"] is False and len(result["curve"]) == 1
    assert "BatchNorm moving statistics are not finite" in validate_converge(result)
    drop = cv.train_to_accuracy(spec(digits_dataset, batch=718, max_epochs=1,
                                     target_accuracy=None),
                                model.train_epoch, model.evaluate, lambda: (True, ""),
                                rank=1, world=2)
    assert "status" not in drop and drop["moving_stats_finite"] is True


def test_the_parent_rejects_a_curve_that_does_not_hold_together() -> None:
    good = {"curve": [{"epoch": 1, "accuracy": 0.5, "wall_s": 1.0},
                      {"epoch": 2, "accuracy": 0.95, "wall_s": 2.0}],
            "final_accuracy": 0.95, "best_accuracy": 0.95, "epochs_to_target": 2,
            "time_to_target_s": 2.0, "converge": {"target_accuracy": 0.9},
            "images_per_sec": 100.0, "moving_stats_finite": True}
    assert validate_converge(good) == []
    assert validate_converge({**good, "epochs_to_target": 1})  # below the target
    assert validate_converge({**good, "time_to_target_s": 1.0})
    assert validate_converge({**good, "final_accuracy": 0.5})
    assert validate_converge({**good, "curve": []})
    assert validate_converge({**good, "curve": [{"epoch": 1, "accuracy": 1.5, "wall_s": 1}]})
    missed = {**good, "epochs_to_target": None, "time_to_target_s": None}
    assert validate_converge(missed)  # no reason given
    assert validate_converge({**missed, "target_reason": "not reached"}) == []


# ---- the config, the plan, the dry run ----

def write(tmp_path: Path, **over: object) -> Path:
    raw = yaml.safe_load(Path("configs/converge-digits.yaml").read_text())
    raw.update(over)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_plan_gives_every_run_the_whole_recipe(tmp_path: Path, digits_dataset: Path
                                                   ) -> None:
    cfg = load_config(str(write(tmp_path, dataset={"path": str(digits_dataset)})),
                      ["converge.lr_scaling=sqrt"])
    runs = expand(cfg, "s")
    assert [r.run_id for r in runs][:1] == ["converge__torch_ddp__small_cnn__n1__b32__real-w0"
                                            "__fp32__r0"]
    assert all(r.mode == "converge" and r.data == "real" for r in runs)
    assert runs[0].converge == {**RECIPE, "target_accuracy": 0.95, "lr_scaling": "sqrt"}
    assert runs[0].dataset == {"path": str(digits_dataset), "augmentation": "none",
                               "workers": 0}


@pytest.mark.parametrize(("over", "sets", "says"), [
    ({}, ["mode=benchmark"], "converge: "),  # a recipe without the mode
    ({}, ["mode=[converge,benchmark]"], "mode: "),
    ({}, ["data=synthetic"], "data: "),
    ({}, ["converge.lr_scaling=cubic"], "converge.lr_scaling: "),
    ({}, ["converge.warmup_epochs=20"], "converge.warmup_epochs: "),
    ({}, ["converge.target_accuracy=1.5"], "converge.target_accuracy: "),
    ({}, ["dataset.workers=4"], "dataset.workers: "),
    ({"dataset": None}, [], "dataset: missing"),
])
def test_bad_converge_input_is_one_line_and_exit_2(tmp_path: Path, digits_dataset: Path,
                                                   over: dict, sets: list[str], says: str
                                                   ) -> None:
    config = write(tmp_path, **{"dataset": {"path": str(digits_dataset)}, **over})
    args = ["--config", str(config), "--dry-run"]
    for s in sets:
        args += ["--set", s]
    cli = run_cli if says == "converge: " else main_here  # one case through the real CLI
    proc = cli(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_folder_without_splits_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "prepared"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"classes": 10}')
    proc = run_cli("--config", str(write(tmp_path, dataset={"path": str(folder)})),
                   "--dry-run")
    assert proc.returncode == 2 and "splits.npz" in proc.stderr


def test_a_dry_run_before_the_dataset_is_made_plans_its_runs_with_the_command(
        tmp_path: Path) -> None:
    """Issue 42 item 4: a dataset folder not made yet is no config error; the dry run shows the
    plan, its runs unavailable, and the command that makes the folder (a folder that exists
    without a manifest is still refused)."""
    missing = tmp_path / "not-yet"
    proc = run_cli("--config", str(write(tmp_path, dataset={"path": str(missing)})),
                   "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "predicted: 0 will run" in proc.stdout
    assert (f"dataset.path {missing} is not made yet; make it first: python run_bench.py "
            f"make-dataset --source digits --out {missing}") in proc.stdout
    missing.mkdir()
    proc = run_cli("--config", str(write(tmp_path, dataset={"path": str(missing)})),
                   "--dry-run")
    assert proc.returncode == 2 and "has no manifest.json" in proc.stderr


def test_the_dry_run_says_which_runners_do_not_converge_and_why(tmp_path: Path,
                                                                digits_dataset: Path) -> None:
    config = write(tmp_path, dataset={"path": str(digits_dataset)},
                   runners=["torch_ddp", "tensorpack", "torch_fsdp2"], devices=[2])
    proc = run_cli("--config", str(config), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "tensorpack does not train to accuracy" in proc.stdout
    assert "torch_fsdp2 does not train to accuracy (mode converge): a sharded strategy" \
        in proc.stdout
    assert "converge__torch_ddp__small_cnn__n2__b32__real-w0__fp32__r0: " not in proc.stdout
    assert "recipe: target 95%" in proc.stdout
    cfg = load_config(str(config), [])
    runs = {r.runner: r for r in expand(cfg, "s")}
    assert precheck(runs["torch_ddp"], None) is None
    assert precheck(runs["tensorpack"], None)[0] == "unavailable"


# ---- make-dataset ----

def test_digits_are_written_with_a_fixed_split_in_every_format(digits_dataset: Path) -> None:
    import json

    manifest = json.loads((digits_dataset / "manifest.json").read_text())
    assert manifest["source"] == "digits" and manifest["classes"] == 10
    assert manifest["splits"]["train"] == 1437 and manifest["splits"]["heldout"] == 360
    assert manifest["images"] == 1437  # the JPEG list, RecordIO and TFRecord: the training split
    with np.load(digits_dataset / "splits.npz") as data:
        assert data["x_train"].shape == (1437, 32, 32, 3) and data["x_train"].dtype == np.uint8
        assert data["x_heldout"].shape == (360, 32, 32, 3)
        assert sorted(set(data["y_heldout"].tolist())) == list(range(10))
        held = data["x_heldout"]
    # the same bytes on every machine: the split is a seeded permutation
    again = run_cli("make-dataset", "--source", "digits", "--out", str(digits_dataset.parent
                                                                      / "again"))
    assert again.returncode == 0
    with np.load(digits_dataset.parent / "again" / "splits.npz") as data:
        assert np.array_equal(data["x_heldout"], held)
    assert (digits_dataset / "train.rec").stat().st_size > 0


def _cifar_archive(path: Path, per_batch: int = 6) -> None:
    """A CIFAR-10 python-version archive of the published layout (tiny batches)."""
    import io
    import pickle
    import tarfile

    rng = np.random.default_rng(0)

    def batch(n: int) -> bytes:
        return pickle.dumps({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                             b"labels": [int(v) for v in rng.integers(0, 10, n)]})

    members = {f"cifar-10-batches-py/data_batch_{i}": batch(per_batch) for i in range(1, 6)}
    members["cifar-10-batches-py/test_batch"] = batch(4)
    members["cifar-10-batches-py/batches.meta"] = pickle.dumps(
        {b"label_names": [f"c{k}".encode() for k in range(10)]})
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_cifar10_is_converted_from_the_users_archive(tmp_path: Path) -> None:
    archive = tmp_path / "cifar-10-python.tar.gz"
    _cifar_archive(archive)
    out = tmp_path / "cifar10"
    proc = run_cli("make-dataset", "--source", "cifar10", "--from", str(archive), "--out",
                   str(out))
    assert proc.returncode == 0, proc.stderr
    with np.load(out / "splits.npz") as data:
        assert data["x_train"].shape == (30, 32, 32, 3) and data["x_heldout"].shape == (4, 32,
                                                                                     32, 3)
    import pickle
    import tarfile

    with tarfile.open(archive) as tar:
        first = pickle.loads(tar.extractfile("cifar-10-batches-py/data_batch_1").read(),
                             encoding="bytes")
    with np.load(out / "splits.npz") as data:  # channel planes -> HWC, in order
        assert np.array_equal(data["x_train"][0], first[b"data"][0].reshape(3, 32, 32)
                              .transpose(1, 2, 0))


@pytest.mark.parametrize(("args", "says"), [
    (["--source", "cifar10"], "--from: missing"),
    (["--source", "cifar10", "--from", "/nonexistent.tar.gz"], "--from: "),
    (["--source", "digits", "--classes", "3"], "--classes: "),
    (["--source", "synthetic", "--classes", "3", "--images", "6"], "--size: missing"),
])
def test_bad_make_dataset_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                                       says: str) -> None:
    cli = run_cli if says == "--from: missing" else main_here  # one case through the real CLI
    proc = cli("make-dataset", "--out", str(tmp_path / "o"), *args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_damaged_cifar_archive_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tar")
    proc = run_cli("make-dataset", "--source", "cifar10", "--from", str(bad), "--out",
                   str(tmp_path / "o"))
    assert proc.returncode == 2 and "--from: " in proc.stderr

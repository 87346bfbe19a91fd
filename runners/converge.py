"""Child-side time to accuracy (mode converge), framework-free: the recipe, the data, the loop.

Every runner converges through `train_to_accuracy` on the same batches (order, short last batch,
augmentation drawn here from the recipe's seed), giving `train_epoch` (or its step to
`stepwise`), `evaluate` and optionally `moving_stats`; the rules: docs/CONVERGENCE.md, "The loop
in the child". Imports numpy only."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runners.common import Spec, Unavailable

SHIFT = 0.1  # seed 004's width_shift_range and height_shift_range
SCALE = 255.0  # pixels less the mean image, over 255 (see the module docstring)


@dataclass(frozen=True)
class Batch:
    """One step's rows for this process: float32 images (B, H, W, C) and int32 labels."""

    x: np.ndarray
    y: np.ndarray
    global_rows: int  # the rows of the whole global batch this step (all processes)


@dataclass(frozen=True)
class Splits:
    """A dataset's training and held-out splits, as uint8 images and int labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_heldout: np.ndarray
    y_heldout: np.ndarray
    classes: int
    mean: np.ndarray  # the training split's per-pixel mean image, float32 (H, W, C)

    def heldout(self) -> tuple[np.ndarray, np.ndarray]:
        """The held-out split preprocessed: float32 less the mean image, int32 labels."""
        return ((self.x_heldout.astype(np.float32) - self.mean) / SCALE,
                self.y_heldout.astype(np.int32))


def load_splits(spec: Spec) -> Splits:
    """The run's dataset's splits.npz; Unavailable when the folder has none."""
    if not spec.dataset:
        raise Unavailable("mode converge needs a dataset (dataset.path)")
    path = Path(spec.dataset["path"]) / "splits.npz"
    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in ("x_train", "y_train", "x_heldout", "y_heldout")}
    except (OSError, KeyError, ValueError) as exc:
        raise Unavailable(f"{path}: no training and held-out splits ({exc}); write them with "
                          "`run_bench.py make-dataset --source digits --out DIR`") from exc
    classes = int(max(arrays["y_train"].max(), arrays["y_heldout"].max())) + 1
    mean = arrays["x_train"].astype(np.float32).mean(axis=0)
    return Splits(**arrays, classes=classes, mean=mean)


def fitting_splits(spec: Spec, model_spec: Any) -> Splits:
    """The run's splits (load_splits), checked against its model (a models.ModelSpec): an
    image classifier whose input is the dataset's image shape and whose outputs cover its
    classes; Unavailable otherwise (a token model trains on no image dataset)."""
    if model_spec.input_kind != "image":
        raise Unavailable(f"mode converge trains an image classifier on the dataset's splits; "
                          f"{model_spec.name} takes {model_spec.input_kind}")
    splits = load_splits(spec)
    shape = tuple(splits.x_train.shape[1:])
    if shape != tuple(model_spec.input_shape):
        raise Unavailable(f"the dataset's images are {shape}; {model_spec.name} takes "
                          f"{tuple(model_spec.input_shape)}")
    if splits.classes > model_spec.num_classes:
        raise Unavailable(f"the dataset has {splits.classes} classes; {model_spec.name} has "
                          f"{model_spec.num_classes} outputs")
    return splits


@dataclass(frozen=True)
class Recipe:
    """The training recipe of a converge run, resolved for its global batch."""

    target_accuracy: float | None
    max_epochs: int
    optimizer: str
    momentum: float
    weight_decay: float
    base_lr: float
    reference_batch: int
    lr_scaling: str
    warmup_epochs: float
    schedule: str
    poly_power: float
    step_epochs: int
    step_gamma: float
    last_batch: str
    augmentation: str
    seed: int
    global_batch: int

    @classmethod
    def of(cls, spec: Spec) -> Recipe:
        c = dict(spec.converge or {})
        names = [f for f in cls.__dataclass_fields__ if f != "global_batch"]
        missing = [n for n in names if n not in c]
        if missing:
            raise Unavailable(f"the spec's converge recipe lacks {missing} (the parent fills "
                              "every key: an old spec?)")
        return cls(**{n: c[n] for n in names}, global_batch=spec.global_batch_size)

    @property
    def scale(self) -> float:
        """The learning rate's factor for this global batch (lr_scaling)."""
        ratio = self.global_batch / self.reference_batch
        return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[self.lr_scaling]

    @property
    def peak_lr(self) -> float:
        return self.base_lr * self.scale

    def lr(self, epoch: int, step: int, steps: int) -> float:
        """The learning rate of step `step` of `steps` in epoch `epoch` (both from 0)."""
        progress = epoch + step / max(steps, 1)
        if progress < self.warmup_epochs:
            return self.base_lr + (self.peak_lr - self.base_lr) * progress / self.warmup_epochs
        peak, t = self.peak_lr, epoch / self.max_epochs
        if self.schedule == "poly":
            return peak * (1.0 - t) ** self.poly_power
        if self.schedule == "cosine":
            return peak * 0.5 * (1.0 + math.cos(math.pi * t))
        if self.schedule == "step":
            return peak * self.step_gamma ** (epoch // self.step_epochs)
        return peak

    def summary(self) -> dict[str, Any]:
        return {**{f: getattr(self, f) for f in self.__dataclass_fields__},
                "lr_scale": self.scale, "peak_lr": self.peak_lr}


def epoch_indices(recipe: Recipe, n: int, epoch: int) -> list[np.ndarray]:
    """The global batches of one epoch as indices into the training split: a permutation
    seeded by (seed, epoch), cut into global batches, the short last one dropped, padded or
    kept (recipe.last_batch)."""
    order = np.random.default_rng([recipe.seed, epoch]).permutation(n)
    b = recipe.global_batch
    whole, rest = divmod(n, b)
    batches = [order[i * b:(i + 1) * b] for i in range(whole)]
    if rest and recipe.last_batch == "pad":
        batches.append(np.concatenate([order[whole * b:], order[:b - rest]]))
    elif rest and recipe.last_batch == "keep":
        batches.append(order[whole * b:])
    return batches


def augment(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """shift-flip, as Keras' ImageDataGenerator(width_shift_range=0.1, height_shift_range=0.1,
    horizontal_flip=True, fill_mode="nearest") of seed 004: each image shifted by a whole
    number of pixels up to 10% of its side (edge pixels repeated) and flipped with p 1/2."""
    n, h, w = images.shape[:3]
    dy, dx = int(round(SHIFT * h)), int(round(SHIFT * w))
    padded = np.pad(images, ((0, 0), (dy, dy), (dx, dx), (0, 0)), mode="edge")
    out = np.empty_like(images)
    oy = rng.integers(0, 2 * dy + 1, n)
    ox = rng.integers(0, 2 * dx + 1, n)
    flip = rng.random(n) < 0.5
    for i in range(n):
        img = padded[i, oy[i]:oy[i] + h, ox[i]:ox[i] + w]
        out[i] = img[:, ::-1] if flip[i] else img
    return out


def epoch_batches(recipe: Recipe, splits: Splits, epoch: int, rank: int = 0,
                  world: int = 1) -> list[Batch]:
    """This process's batches of one epoch: rank `rank` of `world` processes takes its share
    of each global batch (rows [r x b, (r + 1) x b) of whole batches, numpy.array_split's
    share of a short kept one, which may be empty). Augmented over the global batch with a
    generator seeded by (seed, epoch, step), so every process and framework sees the same
    pixels."""
    out = []
    for step, idx in enumerate(epoch_indices(recipe, len(splits.y_train), epoch)):
        x = splits.x_train[idx]
        if recipe.augmentation == "shift-flip":
            x = augment(x, np.random.default_rng([recipe.seed, epoch, step, 1]))
        x = (x.astype(np.float32) - splits.mean) / SCALE
        y = splits.y_train[idx].astype(np.int32)
        if world > 1:
            share = np.array_split(np.arange(len(idx)), world)[rank]
            x, y = x[share], y[share]
        out.append(Batch(x=np.ascontiguousarray(x), y=y, global_rows=len(idx)))
    return out


TrainEpoch = Callable[[int, list[Batch], Callable[[int], float]], float]
Evaluate = Callable[[np.ndarray, np.ndarray], float]
MovingStats = Callable[[], tuple[bool, str]]


def stepwise(step: Callable[[Batch, float, int], Any],
             mean_loss: Callable[[list[Any]], float] | None = None) -> TrainEpoch:
    """The epoch loop of a runner with its own step function: `step(batch, lr, epoch)` sets the
    rate and launches one step on one batch, returning its loss (a device value is fine);
    `mean_loss(losses)` waits for them and gives the epoch's mean (default: float each)."""

    def train_epoch(epoch: int, batches: list[Batch], lr_at: Callable[[int], float]) -> float:
        losses = [step(b, lr_at(i), epoch) for i, b in enumerate(batches)]
        if mean_loss is not None:
            return float(mean_loss(losses))
        return float(np.mean([float(v) for v in losses])) if losses else float("nan")

    return train_epoch


@dataclass
class _Progress:
    """What the converge loop has seen so far: the curve, the point that reached the target,
    the first problem, and the clocks."""

    curve: list[dict[str, Any]] = field(default_factory=list)
    reached: dict[str, Any] | None = None
    problem: str | None = None
    train_s: float = 0.0
    eval_s: float = 0.0
    samples: int = 0
    t0: float = field(default_factory=time.perf_counter)
    wall0: float = field(default_factory=time.time)


def train_to_accuracy(spec: Spec, train_epoch: TrainEpoch, evaluate: Evaluate,
                      moving_stats: MovingStats | None = None, rank: int = 0, world: int = 1,
                      splits: Splits | None = None) -> dict[str, Any]:
    """Train epoch by epoch until the target or max_epochs; the result's converge fields.

    Status invalid (the curve kept) when a train loss is not finite or a BatchNorm moving
    statistic is not (read after every epoch)."""
    recipe = Recipe.of(spec)
    splits = splits if splits is not None else load_splits(spec)
    x_eval, y_eval = splits.heldout()
    run = _Progress()
    for epoch in range(recipe.max_epochs):
        batches = epoch_batches(recipe, splits, epoch, rank, world)
        steps = len(batches)
        lr_at = functools.partial(recipe.lr, epoch, steps=steps)  # lr_at(step)
        start = time.perf_counter()
        loss = float(train_epoch(epoch, batches, lr_at))
        mid = time.perf_counter()
        accuracy = float(evaluate(x_eval, y_eval))
        end = time.perf_counter()
        rows = sum(b.global_rows for b in batches)
        run.samples += rows
        run.train_s += mid - start
        run.eval_s += end - mid
        point = {"epoch": epoch + 1, "wall_s": round(end - run.t0, 4),
                 "train_s": round(mid - start, 4), "eval_s": round(end - mid, 4),
                 "train_loss": loss if math.isfinite(loss) else None,
                 "accuracy": accuracy, "lr": lr_at(0), "steps": steps,
                 "images_per_sec": rows / (mid - start) if mid > start else None}
        if moving_stats is not None:
            finite, detail = moving_stats()
            point["moving_stats_finite"] = bool(finite)
            if not finite:
                run.problem = (f"BatchNorm moving statistics are not finite after epoch "
                               f"{epoch + 1} ({detail}): the model predicts from them")
        run.curve.append(point)
        if not math.isfinite(loss) and run.problem is None:
            run.problem = f"train loss is {loss} in epoch {epoch + 1}"
        if run.problem:
            break
        if recipe.target_accuracy is not None and accuracy >= recipe.target_accuracy:
            run.reached = point
            break
    return _result(recipe, splits, run, time.perf_counter() - run.t0)


def _result(recipe: Recipe, splits: Splits, run: _Progress, total_s: float) -> dict[str, Any]:
    curve, reached, problem = run.curve, run.reached, run.problem
    accuracies = [p["accuracy"] for p in curve]
    later = curve[1:] or curve
    later_s = sum(p["train_s"] for p in later)
    later_rows = sum((p["images_per_sec"] or 0) * p["train_s"] for p in later)
    if reached is not None:
        why = None
    elif recipe.target_accuracy is None:
        why = "no target_accuracy set: trained max_epochs"
    elif problem:
        why = f"stopped: {problem}"
    else:
        why = (f"best held-out accuracy {max(accuracies):.4f} < target "
               f"{recipe.target_accuracy} in max_epochs={recipe.max_epochs}")
    out: dict[str, Any] = {
        "converge": {**recipe.summary(), "train_images": int(len(splits.y_train)),
                     "heldout_images": int(len(splits.y_heldout)),
                     "preprocessing": "float32 less the training split's per-pixel mean "
                                      "image (seed 004)"},
        "curve": curve,
        "epochs_run": len(curve),
        "final_accuracy": accuracies[-1] if accuracies else None,
        "best_accuracy": max(accuracies) if accuracies else None,
        "epochs_to_target": reached["epoch"] if reached else None,
        "time_to_target_s": reached["wall_s"] if reached else None,
        "target_reason": why,
        "train_time_s": round(run.train_s, 4),
        "eval_time_s": round(run.eval_s, 4),
        "converge_time_s": round(total_s, 4),
        "moving_stats_finite": all(p.get("moving_stats_finite", True) for p in curve),
        "first_loss": curve[0]["train_loss"] if curve else None,
        "last_loss": curve[-1]["train_loss"] if curve else None,
        "images_per_sec": later_rows / later_s if later_s > 0 else None,
        "samples": run.samples,
        "window_start": run.wall0,
        "window_end": run.wall0 + total_s,
    }
    if problem:
        out.update(status="invalid", reason=problem)
    return out

"""Mode converge over a DeviceRank: a torchrun runner's own step (StepParts) in runners.converge's
stepwise and train_to_accuracy; each rank's loss is its summed cross-entropy x world / the global
batch's rows, so the ranks' mean gradient is the global batch's even for unequal shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from contract.reasons import code
from contract.result import join
from runners.common import Invalid, Spec
from runners.converge import Batch, Splits, stepwise, train_to_accuracy
from runners.torch.dist import DeviceRank, StepParts, autocast, check_rows, rank_table, train_on

EVAL_BATCH = 500  # held-out images per inference call
LOSS_KIND = code("torch.rank_loss")
INPUT = ("the dataset's splits (splits.npz) in memory; each rank's rows copied to its device "
         "per step")


@dataclass(frozen=True)
class ConvergeModel:
    """How mode converge reads a runner's model beside its training step: `to_input` (the
    Batch's NHWC float32 pixels as the model's input on the rank's device), `infer` (logits in
    inference mode, BatchNorm's moving statistics, outside DDP: no collective) and `bn_stats`
    (every BatchNorm moving mean and variance the rank holds, named)."""

    to_input: Callable[[np.ndarray], torch.Tensor]
    infer: Callable[[torch.Tensor], torch.Tensor]
    bn_stats: Callable[[], list[tuple[str, torch.Tensor]]]


class RankConverge:
    """The adapter: step (the runner's StepParts, the learning rate set in every param group
    before it), mean_loss, evaluate (rank 0 infers, an all-sum shares its accuracy so every
    rank stops at the same epoch), moving_stats (gathered from every rank) and the record."""

    def __init__(self, ranks: DeviceRank, precision: str, parts: StepParts,
                 model: ConvergeModel) -> None:
        self.ranks, self.precision, self.parts, self.model = ranks, precision, parts, model
        self.steps = 0  # the steps this rank took (applied or skipped by the GradScaler)

    def step(self, b: Batch, lr: float, epoch: int) -> torch.Tensor:
        for group in self.parts.optimizer.param_groups:
            group["lr"] = lr
        x = self.model.to_input(b.x)
        y = torch.from_numpy(b.y.astype(np.int64)).to(self.ranks.device)
        scale = self.ranks.world / b.global_rows
        loss = train_on(self.ranks, self.precision, self.parts, x, lambda logits: F.cross_entropy(
            logits.float(), y, reduction="sum") * scale)
        self.steps += 1
        return loss.double()

    def mean_loss(self, losses: list[torch.Tensor]) -> float:
        if not losses:
            return float("nan")
        per_step = self.ranks.all_sum(torch.stack(losses)) / self.ranks.world  # waits for them
        return float(per_step.mean().item())

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        ranks = self.ranks
        accuracy = torch.zeros((), dtype=torch.float64, device=ranks.device)
        if ranks.rank == 0:
            correct = 0
            with torch.no_grad(), autocast(ranks, self.precision, self.parts.cast):
                for i in range(0, len(y), EVAL_BATCH):
                    logits = self.model.infer(self.model.to_input(x[i:i + EVAL_BATCH]))
                    predicted = logits.float().argmax(dim=1).cpu().numpy()
                    correct += int((predicted == y[i:i + EVAL_BATCH]).sum())
            accuracy.fill_(correct / len(y))
        return float(ranks.all_sum(accuracy).item())

    def moving_stats(self) -> tuple[bool, str]:
        stats = self.model.bn_stats()
        bad = next((name for name, t in stats if not bool(torch.isfinite(t).all())), None)
        worst = [f"rank {r}: {name}" for r, name in enumerate(self.ranks.gather(bad))
                 if name is not None]
        if worst:
            return False, "; ".join(worst)
        return True, (f"{len(stats)} moving means and variances finite on each of "
                      f"{self.ranks.world} rank(s)")

    def record(self, spec: Spec, samples: int) -> dict[str, Any]:
        """After the last epoch, on every rank: the placement of every training step (each
        rank's rows, adding up to the epochs' samples), the steps each rank took (which must
        agree), each rank's rows of a global batch, the ranks' record."""
        counter = self.parts.counter
        table = rank_table(self.ranks, [self.steps, counter.applied, counter.skipped])
        steps = [s for s, _, _ in table]
        if len(set(steps)) != 1 or any(a + k != s for s, a, k in table):
            raise Invalid(f"ranks' steps taken / applied / skipped disagree: {table}")
        placement = self.ranks.placement(self.parts.tracker)
        check_rows(placement["placement"], samples)
        shares = [len(s) for s in np.array_split(np.arange(spec.global_batch_size),
                                                  self.ranks.world)]
        return join(placement, {"steps_per_rank": steps,
                                "steps_skipped_by_grad_scaler": min(k for *_, k in table),
                                "loss_kind": LOSS_KIND, "batch_size_per_rank": shares,
                                "input": INPUT}, self.ranks.record())

    def run(self, spec: Spec, splits: Splits) -> dict[str, Any]:
        """train_to_accuracy over this rank's share of the batches; its result and the record."""
        result = train_to_accuracy(spec, stepwise(self.step, self.mean_loss), self.evaluate,
                                   self.moving_stats, self.ranks.rank, self.ranks.world, splits)
        return join(result, self.record(spec, result["samples"]))


def torch_bn_stats(net: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every torch BatchNorm layer's running_mean and running_var, named."""
    out = []
    for name, module in net.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            out += [(f"{name}.running_mean", module.running_mean),
                    (f"{name}.running_var", module.running_var)]
    return out

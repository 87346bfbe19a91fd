"""torch_ddp's `cross_entropy` option (contract/cross_entropy.py) on the step's logits, and the
dtype the loss was computed in, read back from the first step's autograd graph (the saved
result of each LogSoftmaxBackward0 node). Imports torch: child processes only.

Differs from the originals: `chunked` follows torchtune's CEWithChunkedOutputLoss (chunks by
tensor_split along the sequence, F.cross_entropy(chunk.float(), reduction="sum") each, the sum
over the token count; no ignore_index: every position is a target) but splits the model's
whole logits, where torchtune's model applies its output layer per chunk, and leaves the loss
uncompiled (torchtune's recipes compile compute_cross_entropy when they compile). Liger's fused
linear-cross-entropy (a Triton GPU kernel fusing the LM head's matmul) is not reproduced."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from contract import cross_entropy as ce
from contract.reasons import code

GRAPH_NODES = 256  # the autograd nodes walked from the loss, at most, looking for log-softmax
SOURCE = code("torch.log_softmax_dtype")


def token_loss(logits: torch.Tensor, targets: torch.Tensor, option: str) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of (batch, sequence, vocabulary)
    logits, as `option` says. bf16_logits steps out of the run's autocast for the loss:
    autocast's own policy would compute cross_entropy in float32 (its float32 list on CPU;
    log_softmax's float32 output on CUDA)."""
    if option == "bf16_logits":
        with torch.autocast(logits.device.type, enabled=False):
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten().long())
    if option == "chunked":
        total = sum(F.cross_entropy(part.float().flatten(0, 1), labels.flatten().long(),
                                    reduction="sum")
                    for part, labels in zip(logits.tensor_split(ce.CHUNKS, dim=1),
                                            targets.tensor_split(ce.CHUNKS, dim=1), strict=True))
        return total / targets.numel()
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten().long())


def loss_of(logits: torch.Tensor, targets: torch.Tensor, option: str = "float32"
            ) -> torch.Tensor:
    """Mean cross-entropy: next-token logits' by token_loss (`option`), 2-D logits' on float32
    (whatever the option)."""
    if logits.dim() == 3:
        return token_loss(logits, targets, option)
    return F.cross_entropy(logits.float(), targets)


def log_softmax_dtypes(loss: torch.Tensor) -> list[str]:
    """The dtypes of the log-softmax results the loss's autograd graph saved (one per
    cross-entropy call), walking at most GRAPH_NODES nodes back from the loss."""
    seen: set[Any] = set()
    stack, found = [loss.grad_fn], []
    while stack and len(seen) < GRAPH_NODES:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "LogSoftmaxBackward0":
            found.append(str(node._saved_result.dtype))
            continue
        stack.extend(child for child, _ in node.next_functions)
    return found


@dataclass
class CrossEntropy:
    """The step's loss function under the option; the first call's logits and loss read back."""

    option: str = "float32"
    read: dict[str, Any] = field(default_factory=dict)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = loss_of(logits, targets, self.option)
        if not self.read:
            self.read = {"logits_dim": logits.dim(), "logits_dtype": str(logits.dtype),
                         "log_softmax_dtypes": log_softmax_dtypes(loss),
                         "loss_dtype": str(loss.dtype)}
        return loss

    def record(self) -> dict[str, Any]:
        """The record's `cross_entropy`: the option, what ran (contract.cross_entropy.applied)
        and what the first step's graph said; empty read where no step ran."""
        read = self.read
        if not read:
            return {"cross_entropy": {"option": self.option, "applied": None,
                                      "note": "no step took the loss"}}
        ran, note = ce.applied(self.option, read["logits_dim"], read["logits_dtype"])
        dtypes = read["log_softmax_dtypes"]
        return {"cross_entropy": {
            "option": self.option, "applied": ran,
            "chunks": ce.CHUNKS if ran == "chunked" else 1,
            "logits_dtype": read["logits_dtype"], "loss_dtype": read["loss_dtype"],
            "log_softmax_calls": len(dtypes),
            "computed_in": sorted(set(dtypes)), "source": SOURCE,
            **({"note": note} if note else {})}}

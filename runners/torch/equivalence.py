"""Mode equivalence over a DeviceRank: one call of a runner's own benchmark step on the probe
model at the canonical weights, each rank on its slice of the equivalence batch, counted by
the optimizer's hooks on every rank; rank 0 saves the weights after it. Imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from models import get_spec, load_builder
from runners.common import Invalid, Spec, finite
from runners.torch import dist as td
from runners.torch.data import LoaderConfig, equivalence_input


def probe_equivalence(spec: Spec, ranks: td.DeviceRank,
                      make_step: Callable[[nn.Module, td.Feed, float],
                                          tuple[td.Step, td.StepParts]],
                      layout: str = "channels_first",
                      canonical: Callable[[nn.Module], dict[str, np.ndarray]] | None = None,
                      **own: Any) -> dict[str, Any]:
    """The equivalence mode over a runner's step function: the probe model at the given
    canonical weights on the rank's device (`layout`), its slice of the batch resident there
    (equivalence_input), `make_step(net, feed, learning_rate)` (plain SGD) called once by
    equivalence_step; rank 0 saves `canonical(net)` (default: the probe's canonical weights; a
    sharded strategy's full weights, gathered by every rank); the ranks closed. `own`: the
    runner's fields (its `framework` replaces torch's)."""
    from models.torch_common import get_canonical_weights, set_canonical_weights

    weights, x, y, lr = spec.equivalence_inputs()
    feed = equivalence_input(x, y, ranks.place,
                             LoaderConfig(memory_format=td.MEMORY_FORMATS[layout]))
    net = load_builder("probe", "torch")(get_spec("probe"), data_format=layout)
    set_canonical_weights(net, weights)
    net = net.to(ranks.device)
    step, parts = make_step(net, feed, lr)
    own = {"framework": td.framework_versions(), "layout": layout, **own}
    weights_of = canonical or get_canonical_weights
    return equivalence_step(spec, ranks, step, parts.counter, parts.tracker,
                            lambda: weights_of(net), **own)


def equivalence_step(spec: Spec, ranks: td.DeviceRank, step: Callable[[], torch.Tensor],
                     counter: td.StepCounter, tracker: td.PlacementTracker,
                     canonical: Callable[[], dict[str, np.ndarray]], **own: Any
                     ) -> dict[str, Any]:
    """One call of the benchmark's `step`, counted by the optimizer's hooks on every rank;
    every rank reads the canonical weights, rank 0 saves them; the result (the step's
    placement, the global loss, the ranks' record, the runner's `own` fields); the ranks
    closed."""
    tracker.reset()
    applied0 = counter.applied
    loss = step()
    td.synchronize(ranks)
    steps = [applied for applied, in td.rank_table(ranks, [counter.applied - applied0])]
    if steps != [1] * ranks.world:
        raise Invalid(f"the equivalence step applied {steps} optimizer steps per rank, not 1")
    global_loss = finite(td.global_mean_losses([loss.item()], ranks)[0])
    placement = ranks.placement(tracker)
    weights = canonical()  # on every rank: a sharded strategy gathers its weights collectively
    if ranks.rank == 0:
        spec.save_equivalence_output(weights)
    return td.closing(ranks, placement, ranks.record(), {"loss": global_loss}, own)

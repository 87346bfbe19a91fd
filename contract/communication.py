"""What a strategy's training step communicates, as a catalog entry declares it (RunnerInfo's
`collectives`): Phase (one collective, what it moves, when), StepCollectives (a step's
phases, the source of the volume, an assumption made), the phases strategies share, and the
papers they come from. bench/analysis/strategies.py prices them on measured links;
docs/STRATEGIES.md ("Why one should win") says where each strategy's volume comes from."""

from __future__ import annotations

from dataclasses import dataclass

from contract.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER

ZERO_PAPER = ("Rajbhandari et al., ZeRO: Memory Optimizations Toward Training Trillion "
              "Parameter Models, SC 2020, sec. 7")
FSDP_PAPER = ("Zhao et al., PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel, "
              "VLDB 2023, sec. 3")


@dataclass(frozen=True)
class Phase:
    """One collective of a step: what it moves ("gradients" or "parameters") and when."""

    collective: str
    moves: str
    when: str


@dataclass(frozen=True)
class StepCollectives:
    """A strategy's collectives per step, where the volume comes from, and any assumption."""

    phases: tuple[Phase, ...]
    source: str
    assumption: str | None = None


GRAD_AR = Phase(ALL_REDUCE, "gradients", "backward")
GRAD_RS = Phase(REDUCE_SCATTER, "gradients", "backward")
PARAM_AG_STEP = Phase(ALL_GATHER, "parameters", "after the optimizer step")
PARAM_AG_FWD = Phase(ALL_GATHER, "parameters", "forward")
PARAM_AG_BWD = Phase(ALL_GATHER, "parameters", "backward")
ZERO3 = (PARAM_AG_FWD, PARAM_AG_BWD, GRAD_RS)

# all-reduce data parallelism: one all-reduce of the gradients
DATA_PARALLEL = StepCollectives((GRAD_AR,),
                                "a ring all-reduce of the gradients (nccl-tests' 2(N-1)/N)")

# ZeRO (DeepSpeed's stages): 1 and 2 reduce-scatter the gradients and all-gather the updated
# parameters, one all-reduce's volume (sec. 7.2.1); 3 gathers the parameters per layer in
# forward and backward (sec. 7.2.2)
ZERO_1_2 = StepCollectives((GRAD_RS, PARAM_AG_STEP), f"{ZERO_PAPER}.2.1")
ZERO_3 = StepCollectives(ZERO3, f"{ZERO_PAPER}.2.2")
# FSDP: FULL_SHARD re-gathers in backward (as ZeRO-3), SHARD_GRAD_OP keeps the forward's
FSDP_FULL_SHARD = StepCollectives(ZERO3, f"{FSDP_PAPER} (FULL_SHARD)")
FSDP_SHARD_GRAD_OP = StepCollectives((PARAM_AG_FWD, GRAD_RS),
                                     f"{FSDP_PAPER} (SHARD_GRAD_OP: no re-gather in backward)")

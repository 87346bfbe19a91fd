"""The harness's precision policy and how a run's resolved one is recorded (framework-free).

`precision: fp32 | bf16 | fp16` (and torch's tf32) means the same thing in every strategy:
the dtype the forward and backward compute in, the dtype the parameters are stored in, the
master weights the optimizer updates (None: the stored parameters are the master), the dtype
gradients are reduced in across devices, and loss scaling. Each runner sets it through its
framework's documented knobs (torch.autocast, FSDP2's MixedPrecisionPolicy, DeepSpeed's config,
a Keras dtype policy, a JAX compute dtype), reads back what the framework holds, and records
`resolve(...)` as the record's `precision_policy`; a strategy that cannot follow the harness's
policy records follows=False and what differs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PARTS = ("compute", "params", "master", "reduce", "loss_scaling")

HARNESS: dict[str, dict[str, str | None]] = {
    "fp32": {"compute": "float32", "params": "float32", "master": None, "reduce": "float32",
             "loss_scaling": None},
    "tf32": {"compute": "tf32", "params": "float32", "master": None, "reduce": "float32",
             "loss_scaling": None},
    "bf16": {"compute": "bfloat16", "params": "float32", "master": None, "reduce": "float32",
             "loss_scaling": None},
    "fp16": {"compute": "float16", "params": "float32", "master": None, "reduce": "float32",
             "loss_scaling": "dynamic"},
}


def dtype_name(dtype: Any) -> str | None:
    """A framework dtype's plain name ("float32", "bfloat16"); None stays None."""
    if dtype is None:
        return None
    name = str(getattr(dtype, "name", None) or dtype)
    for prefix in ("torch.", "tf.", "jnp.", "<dtype: '"):
        name = name.removeprefix(prefix)
    return name.rstrip("'>")


def harness_policy(precision: str) -> dict[str, str | None]:
    """What `precision` means in every strategy (KeyError for an unknown one)."""
    return dict(HARNESS[precision])


def resolve(precision: str, *, how: str, compute: Any, params: Any, master: Any = None,
            reduce: Any = None, loss_scaling: str | None = None) -> dict[str, Any]:
    """The record's `precision_policy`: what the run did (dtypes as the framework reports them),
    the knobs it used (`how`), and whether that is the harness's policy for `precision`
    (`follows`; `differs` names each part that is not)."""
    did = {"compute": dtype_name(compute), "params": dtype_name(params),
           "master": dtype_name(master), "reduce": dtype_name(reduce),
           "loss_scaling": loss_scaling}
    want = HARNESS.get(precision)
    differs = [] if want is None else [
        f"{part} {did[part] or 'none'} (harness: {want[part] or 'none'})"
        for part in PARTS if did[part] != want[part]]
    return {"precision": precision, **did, "how": how, "follows": want is not None and not differs,
            "differs": "; ".join(differs) or (None if want else f"no harness policy for "
                                                                 f"{precision!r}")}


def declared(precision: str) -> dict[str, Any]:
    """The policy of a runner that does not read its own back (runners.common.main fills it
    in): the harness's for `precision`, said to be declared, not read from the framework;
    `follows` None (not known)."""
    return {"precision": precision, **HARNESS.get(precision, dict.fromkeys(PARTS)),
            "how": "declared, not read back: this runner applies its precision setting and "
                   "does not report the dtypes the framework used",
            "follows": None, "differs": None}


def summary(policy: Mapping[str, Any] | None) -> str:
    """One short line for a table or a chart: 'bf16 compute, fp32 params, fp32 reduce'."""
    if not policy:
        return ""
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "tf32": "tf32"}

    def s(part: str) -> str:
        v = policy.get(part)
        return short.get(v, v) if v else "-"

    text = f"{s('compute')} compute, {s('params')} params, {s('reduce')} reduce"
    if policy.get("master"):
        text += f", {s('master')} master"
    if policy.get("loss_scaling"):
        text += ", loss scaling"
    if policy.get("follows") is None:
        return text + " (declared)"
    return text if policy["follows"] else text + " (differs)"

"""What XLA says of the compiled train step, read from the executable that ran the timed window
(no second compile), after the window: its memory analysis (argument, output, alias, temp and
generated-code bytes; alias bytes > 0: the donated state's buffers were reused for the new
state, read back rather than assumed from donate_argnums) and the attention its HLO runs
(cuDNN's fused-attention custom calls, or XLA's own ops). Imports no framework."""

from __future__ import annotations

import re
from typing import Any

from contract.reasons import code

# jax._src.cudnn.fused_attention_stablehlo's custom-call targets: __cudnn$fmhaSoftmax, ...Backward
CUDNN_FMHA = re.compile(r'custom_call_target="(__cudnn\$fmha\w*)"')
# the record's key -> CompiledMemoryStats' attribute
MEMORY_STATS = {"argument_bytes": "argument_size_in_bytes",
                "output_bytes": "output_size_in_bytes",
                "alias_bytes": "alias_size_in_bytes",
                "temp_bytes": "temp_size_in_bytes",
                "generated_code_bytes": "generated_code_size_in_bytes"}


def memory_record(compiled: Any) -> dict[str, Any] | None:
    """The compiled step's memory analysis in bytes, whether the donated buffers were reused
    (alias bytes > 0), and XLA's peak where this jaxlib reports one (else null); None where the
    backend gives no analysis."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    out: dict[str, Any] = {key: int(getattr(stats, name)) for key, name in MEMORY_STATS.items()}
    peak = getattr(stats, "peak_memory_in_bytes", None)
    out["peak_bytes"] = None if peak is None else int(peak)
    out["donated_buffers_reused"] = out["alias_bytes"] > 0
    out["source"] = code("jax.compiled_memory_source")
    return out


def attention_record(hlo: str, asked: str | None) -> dict[str, Any]:
    """The record's attention fields: the option as applied (`asked`, None where it does not
    apply: "none"), the cuDNN fused-attention custom calls in the compiled HLO and what that
    says ran."""
    targets = CUDNN_FMHA.findall(hlo)
    kernel = (f"cuDNN fused attention: {len(targets)} custom calls "
              f"({', '.join(sorted(set(targets)))}) in the compiled step" if targets else
              code("jax.xla_attention"))
    return {"attention": asked or "none", "attention_custom_calls": len(targets),
            "attention_kernel": kernel}

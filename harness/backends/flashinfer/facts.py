"""FlashInfer facts: the distribution, the GDN entry points, our floors and what its SM90 kernels serve — from
the ``Env`` alone, without importing FlashInfer. The adapter (``adapter.py``) asks these first, then FlashInfer.

Sources (the flashinfer-python 0.7.2.post1 wheel; docs/libraries.md keeps the file:line details):
``flashinfer/gdn_prefill.py`` (``chunk_gated_delta_rule``: packed THD, alpha/beta float32, state
``[N, H, V, K]``; the SM90 branch calls the CuTe DSL kernel), ``gdn_kernels/delta_rule_dsl/delta_rule_sm90.py``
(``delta_rule_prefill_dsl_sm90``: D == 128, fp16/bf16, ``can_implement``'s head rules), ``flashinfer/gdn_decode.py``
(``gated_delta_rule_decode_pretranspose``: one token per call, the softplus gate and sigmoid beta in the kernel,
``gdn_kernels/gdn_decode_pretranspose.py``), ``flashinfer/gdp_prefill.py`` (GDP: cuDNN's SM100 engine only).
"""

from __future__ import annotations

from deltacheck.cases.envelope import Envelope
from deltacheck.harness.machine.environment import Env
from deltacheck.plugin import gathered, no_cuda_reason, package_floor

from ..base import Verdict

DIST = "flashinfer-python"
INSTALL = "pip install 'flashinfer-python[cu13]==0.7.2.post1'  (brings nvidia-cutlass-dsl[cu13] for the CuTe DSL kernels)"
INSTALL_HINT = f"flashinfer-python is not installed ({INSTALL})"
FLOOR = "0.7.2"
DSL_DIST = "nvidia-cutlass-dsl"
DSL_FLOOR = "4.6.2"  # flashinfer 0.7.2's METADATA: nvidia-cutlass-dsl>=4.6.2a0
HOPPER_SM = 90  # the adapter targets the SM90 kernels; other SMs take other FlashInfer kernels, not judged here

PREFILL = ("flashinfer.gdn_prefill", "chunk_gated_delta_rule")
DECODE = ("flashinfer.gdn_decode", "gated_delta_rule_decode_pretranspose")
ENTRY_POINTS = {"flashinfer": PREFILL, "flashinfer-decode": DECODE}

# gdp_prefill.py:126-129: chunk_gated_delta_product "Requires an SM100-family (Blackwell) device" (cuDNN's engine).
GDP_REASON = ("FlashInfer 0.7.2 has no SM90 GDP kernel: flashinfer.gdp_prefill.chunk_gated_delta_product routes to "
              "cuDNN's SM100-family engine only (gdp_prefill.py docstring); judge it through backend cudnn on SM100")

IO_DTYPES = ("bf16", "fp16")  # delta_rule_sm90.py: "DSL kernel only supports fp16/bf16 inputs"
PREFILL_DIMS = ((128, 128),)  # delta_rule_sm90.py: D = K = V, "DSL kernel only supports D=128"
DECODE_DIMS = ((128, 128), (256, 256))  # gdn_decode.py legacy fp32-state path: K >= 128, V >= 128 (we keep K == V)


def floors(backend: str, op: str, env: Env) -> Verdict:
    """Our floors for ``flashinfer:op`` / ``flashinfer-decode:op``: CUDA on SM90, FlashInfer and the CuTe DSL."""
    pair = f"{backend}:{op}"
    unmet: list[str] = []
    notes: list[str] = []
    if op == "gdp":
        return Verdict.no(f"{pair}: {GDP_REASON}")
    if not env.cuda:
        unmet.append(no_cuda_reason(env))
    elif env.sm is not None and env.sm != HOPPER_SM:
        unmet.append(f"needs an SM90 GPU for the kernels this adapter judges, found {env.device()}")
    package_floor(env.version("flashinfer"), DIST, FLOOR, "the GDN prefill/decode API read for this adapter",
                  INSTALL, unmet, notes)
    package_floor(env.version("cutlass_dsl"), DSL_DIST, DSL_FLOOR, "FlashInfer's SM90 GDN kernels are CuTe DSL",
                  f"pip install '{DSL_DIST}[cu13]>={DSL_FLOOR}'", unmet, notes)
    return gathered(pair, unmet, notes)


ENVELOPES = {
    "flashinfer": Envelope("flashinfer chunk_gated_delta_rule (sm90)", "gdn", backward=False, sms=(HOPPER_SM,), allowed={
        "io_dtype": IO_DTYPES, "dims": ("128x128",), "heads": ("mha", "gqa", "gva"),
        "gate_mode": ("log", "linear"), "beta_mode": ("plain",),
    }, source="gdn_prefill.py chunk_gated_delta_rule; delta_rule_sm90.py can_implement"),
    "flashinfer-decode": Envelope("flashinfer gated_delta_rule_decode_pretranspose", "gdn", backward=False,
                                  sms=(HOPPER_SM,), allowed={
        "io_dtype": IO_DTYPES, "dims": ("128x128", "256x256"), "heads": ("mha", "gva"),
        "gate_mode": ("safe", "safe_alog", "safe_dtbias", "safe_alog_dtbias"), "beta_mode": ("sigmoid",),
    }, source="gdn_decode.py gated_delta_rule_decode_pretranspose; gdn_kernels/gdn_decode_pretranspose.py"),
}

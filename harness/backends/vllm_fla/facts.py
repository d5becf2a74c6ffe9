"""vLLM's bundled FLA copy (``vllm/third_party/flash_linear_attention``): the distribution, entry points, our
floor and what its two GDN kernels express — from the ``Env`` alone, without importing vLLM.

Sources (vllm 0.33.0 wheel; docs/libraries.md, "vLLM's FLA copy", cites every line): ``ops/chunk.py``
(``chunk_gated_delta_rule``), ``ops/fused_recurrent.py`` (``fused_recurrent_gated_delta_rule``),
``ops/chunk_delta_h.py`` (the state kernel: heads, K bound, state orientation).
"""

from __future__ import annotations

from deltacheck.cases.envelope import Envelope
from deltacheck.harness.machine.environment import Env
from deltacheck.plugin import gathered, no_cuda_reason, package_floor

from ..base import Verdict

DIST = "vllm"
FLOOR = "0.33"  # the entry points and their keywords were read from the 0.33.0 wheel
INSTALL = ("pip install 'vllm>=0.33' (deltacheck imports only vllm.third_party.flash_linear_attention; it needs "
           "torch, triton and einops, never vLLM's engine)")
INSTALL_HINT = f"vllm is not installed; {INSTALL}"

# The one module the adapter imports. Importing it runs vllm/__init__.py and the modules the copy itself imports
# (vllm.triton_utils, vllm.platforms, vllm.utils.{math,platform,torch}_utils, vllm.utils.gpu_sync_debug,
# vllm.model_executor.warmup.jit_warmup*): vLLM's own small modules, not the engine.
MODULE = "vllm.third_party.flash_linear_attention.ops"
CHUNK = {"gdn": (MODULE, "chunk_gated_delta_rule")}
RECURRENT = {"gdn": (MODULE, "fused_recurrent_gated_delta_rule")}

# ops/chunk_delta_h.py:310 `assert K <= 256`; ops/fused_recurrent.py:194 `assert NK == 1` (BK = next_pow2(K)).
CHUNK_MAX_K = 256

# What i26's serving hooks reach (forward only here): fused_recurrent_gated_delta_rule's keywords beyond the
# forward. ssm_state_indices [N] or [N, T_max] int slots into initial_state (a pool [slots, HV, V, K]); a slot
# <= 0 is the null block: the sequence is skipped (no output, no state write; fused_recurrent.py:112-117, 149-152).
# num_accepted_tokens [N]: the initial state is read from slot ssm_state_indices[n, accepted - 1]
# (fused_recurrent.py:106-110). inplace_final_state=True writes token t's state to slot ssm_state_indices[n, t];
# False returns every token's state, [T, HV, V, K] (fused_recurrent.py:199-202, 153-156).
# vllm/envs.py: VLLM_TRITON_FORCE_FIRST_CONFIG in ("1", "true") (stripped, any case) makes importing
# vllm.triton_utils replace triton's Autotuner.run, process-wide, by one that runs the first valid config
# (vllm/triton_utils/force_first_config.py): the copy's kernels then skip their autotune. Results say so.
FORCE_FIRST_CONFIG = "VLLM_TRITON_FORCE_FIRST_CONFIG"


def first_config_notes(environ) -> list[str]:
    """The note every vllm-fla result carries when vLLM's first-config switch is on (an empty list otherwise)."""
    if environ.get(FORCE_FIRST_CONFIG, "0").strip().lower() not in ("1", "true"):
        return []
    return [f"{FORCE_FIRST_CONFIG}=1: vLLM's Triton kernels ran their first valid config, not the autotuned one "
            "(vllm/triton_utils/force_first_config.py); triton's Autotuner.run is replaced in this whole process"]


SERVING_KWARGS = ("ssm_state_indices", "num_accepted_tokens", "inplace_final_state")
NULL_SLOT = 0


def floors(backend: str, op: str, env: Env) -> Verdict:
    """Our floors for ``vllm-fla:op`` / ``vllm-fla-recurrent:op``; the copy still decides per case."""
    unmet: list[str] = []
    notes: list[str] = []
    if not env.cuda:
        unmet.append(no_cuda_reason(env))
    package_floor(env.version("vllm"), DIST, FLOOR, "the adapter reads the 0.33 copy's keywords", INSTALL,
                  unmet, notes)
    if env.version("triton") is None:
        unmet.append("triton is not installed (vLLM's FLA copy is Triton kernels); pip install triton")
    return gathered(f"{backend}:{op}", unmet, notes,
                    backward_reason="vLLM's FLA copy is inference only: its autograd Functions define no "
                                    "backward (ops/chunk.py:89, ops/fused_recurrent.py:500); use backend 'fla'")


# What both kernels express: q/k at H heads, v/g/beta/state at HV = G*H (GVA; GQA and HK != H are not
# expressible), a log-space scalar decay g [B, T, HV] and a post-activation beta [B, T, HV] (no in-kernel gate,
# no beta sigmoid), use_qk_l2norm_in_kernel, any scale.
_ALLOWED = {"heads": ("mha", "gva"), "gate_mode": ("log",), "beta_mode": ("plain",), "guard": ("off",)}

ENVELOPES = {
    "vllm-fla": Envelope("vllm-fla chunk_gated_delta_rule", "gdn", backward=False,
                         allowed={**_ALLOWED, "dims": ("32x32", "64x64", "96x96", "128x128", "256x256", "64x128",
                                                       "128x64")},
                         source="vllm/third_party/flash_linear_attention/ops/chunk.py"),
    "vllm-fla-recurrent": Envelope("vllm-fla fused_recurrent_gated_delta_rule", "gdn", backward=False,
                                   allowed=dict(_ALLOWED),
                                   source="vllm/third_party/flash_linear_attention/ops/fused_recurrent.py"),
}


def envelopes(backend: str, op: str) -> list[Envelope]:
    envelope = ENVELOPES.get(backend)
    return [envelope] if envelope is not None and envelope.op == op else []

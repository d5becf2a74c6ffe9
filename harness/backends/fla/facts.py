"""flash-linear-attention facts: distributions, entry points, the version floor and FLA's own Hopper guard —
from the ``Env`` alone, without importing FLA. The adapter (``adapter.py``) asks these first, then FLA.

Sources (fla-core 0.6.0; docs/libraries.md keeps the details): ``fla/utils/env.py`` (``TRITON_ABOVE_3_4_0`` /
``TRITON_ABOVE_3_7_1``, compared with ``packaging.version`` as here), ``fla/utils/hardware.py``
(``IS_NVIDIA_HOPPER``), ``fla/ops/common/chunk_o.py`` (the backward guard, FLA issue #640).
"""

from __future__ import annotations

from dataclasses import replace

from deltacheck.cases.envelope import Envelope
from deltacheck.harness.machine.environment import Env, version_in
from deltacheck.plugin import gathered, no_cuda_reason, package_floor

from ..base import Verdict

DISTS = ("fla-core", "flash-linear-attention")
INSTALL = "pip install -U 'fla-core>=0.6'"
INSTALL_HINT = "fla-core is not installed (pip install 'deltacheck[fla]')"
FLOOR = "0.6"  # the adapter targets the 0.6 API (chunk_gdn2, state_v_first)
HOPPER_BAD_TRITON = ">=3.4.0,<3.7.1"  # FLA refuses its gated GDN backward on Hopper in this range (#640)

# op -> (module, function) for each flavour. `fla.ops` re-exports the GDN and KDA entry points (the same
# objects as fla.ops.gated_delta_rule / fla.ops.kda); chunk_gdn2 is not re-exported by fla.ops in 0.6.
CHUNK = {
    "gdn": ("fla.ops", "chunk_gated_delta_rule"),
    "kda": ("fla.ops", "chunk_kda"),
    "gdn2": ("fla.ops.gdn2", "chunk_gdn2"),
}
RECURRENT = {
    "gdn": ("fla.ops", "fused_recurrent_gated_delta_rule"),
    "kda": ("fla.ops", "fused_recurrent_kda"),
    "gdn2": ("fla.ops.gdn2", "fused_recurrent_gdn2"),
}

FLOORS = {"fla-core": FLOOR, "triton range refused by FLA GDN backward on Hopper": HOPPER_BAD_TRITON}


def is_fla_hopper(env: Env) -> bool:
    # FLA's own test (fla/utils/hardware.py): 'NVIDIA H' in the name, or compute capability major 9.
    return env.cuda and (("NVIDIA H" in (env.device_name or "")) or (env.capability or (0, 0))[0] == 9)


def floors(backend: str, op: str, env: Env) -> Verdict:
    """Our floors for ``fla:op`` / ``fla-recurrent:op`` on ``env``; FLA still decides per case."""
    pair = f"{backend}:{op}"
    unmet: list[str] = []
    notes: list[str] = []
    if not env.cuda:
        unmet.append(no_cuda_reason(env))
    package_floor(env.version("fla"), "fla-core", FLOOR, "the adapter targets the 0.6 API: chunk_gdn2, state_v_first",
                  INSTALL, unmet, notes)
    triton = env.version("triton")
    if triton is None:
        unmet.append("triton is not installed (FLA compiles its kernels with Triton); pip install triton")
    backward_reason = ""
    if backend == "fla" and op == "gdn" and triton is not None and is_fla_hopper(env):
        refused = version_in(triton, HOPPER_BAD_TRITON)
        if refused is None:
            notes.append(f"triton version {triton!r} is unreadable; FLA's Hopper GDN-backward guard not evaluated")
        elif refused:
            backward_reason = (
                f"FLA refuses the GDN backward on Hopper, {env.device()}, with triton {triton} "
                f"(3.4.0 <= triton < 3.7.1 gives wrong gradients, FLA #640); pip install -U 'triton>=3.7.1'"
            )
    return gathered(pair, unmet, notes, backward_reason=backward_reason)


# --------------------------------------------------------------------------------------------------
# Envelopes: what FLA's kernels express (fla/ops/*/chunk.py asserts and signatures; docs/libraries.md). FLA has
# no planner that declines: what it cannot express the adapter declines with these facts' reasons.

_LOG_GATES = ("log", "safe", "safe_alog", "safe_dtbias", "safe_alog_dtbias")  # no gate_domain='linear'


def _chunk(op: str, **allowed) -> Envelope:
    return Envelope(f"fla {CHUNK[op][1]}", op, allowed={"heads": ("mha", "gva"), "gate_mode": _LOG_GATES,
                                                       "guard": ("off",), **allowed},
                    source=f"fla/ops/{op if op != 'gdn' else 'gated_delta_rule'}/chunk.py")


CHUNK_ENVELOPES = {
    "gdn": _chunk("gdn"),
    "kda": _chunk("kda"),
    "gdn2": _chunk("gdn2", heads=("mha",), beta_mode=("plain",)),  # one head count; b is post-activation
}
RECURRENT_ENVELOPES = {
    op: Envelope(f"fla {RECURRENT[op][1]}", op, backward=False,
                 allowed={**env.allowed, "heads": ("mha", "gva")}, source=f"fla/ops/*/fused_recurrent.py ({op})")
    for op, env in CHUNK_ENVELOPES.items()
}


def envelopes(backend: str, op: str, env: Env | None = None) -> list[Envelope]:
    """FLA's envelope for ``op`` (any CUDA GPU); on ``env`` its backward follows FLA's own Hopper guard."""
    table = RECURRENT_ENVELOPES if backend == "fla-recurrent" else CHUNK_ENVELOPES
    if op not in table:
        return []
    envelope = table[op]
    if env is not None and envelope.backward and not floors(backend, op, env).backward:
        envelope = replace(envelope, backward=False)
    return [envelope]

"""FlashKDA (CUTLASS KDA forward, Moonshot AI) facts: the two builds deltacheck calls, their entry points, the
architectures their binaries carry and what the kernel expresses — from the ``Env`` alone, without importing.

- ``flashkda``: the op vLLM 0.33 ships, ``vllm/_flashkda_C.abi3.so`` (torch stable ABI), registered on import as
  ``torch.ops._flashkda_C.fwd`` / ``get_workspace_size``; vLLM's caller is ``_flashkda_prefill`` in
  ``vllm/models/kimi_k3/nvidia/kda.py``.
- ``flashkda-tokenspeed``: the standalone wheel ``tokenspeed-flashkda`` (``flash_kda.fwd``, a pybind11 module
  built against libtorch's C++ API, so tied to the torch it was built with).

docs/libraries.md, "FlashKDA", cites the schema, the checks (the binaries' messages) and the caller's lines.
"""

from __future__ import annotations

from deltacheck.cases.envelope import Envelope
from deltacheck.harness.machine.environment import Env
from deltacheck.plugin import gathered, no_cuda_reason, package_floor

from ..base import Verdict

VLLM = "flashkda"
STANDALONE = "flashkda-tokenspeed"

DISTS = {VLLM: "vllm", STANDALONE: "tokenspeed-flashkda"}
VERSION_KEYS = {VLLM: "vllm", STANDALONE: "flashkda"}  # Env.versions keys (environment.DIST_KEYS)
FLOORS = {VLLM: "0.33", STANDALONE: "0.0.1"}
INSTALL = {VLLM: "pip install 'vllm>=0.33' (deltacheck loads only vllm/_flashkda_C.abi3.so from it)",
           STANDALONE: "pip install tokenspeed-flashkda (built against one torch: install the torch it was built with)"}
# What the adapter imports (the vLLM build registers its ops with torch.ops on import) and calls.
MODULES = {VLLM: "vllm._flashkda_C", STANDALONE: "flash_kda"}
ENTRY = {VLLM: "torch.ops._flashkda_C.fwd", STANDALONE: "flash_kda.fwd"}

# The cubins each binary carries (cuobjdump --list-elf; no PTX in either, so no other architecture can JIT them).
# vLLM's own gate (is_flashkda_supported, kimi_k3/nvidia/kda.py:363-379) admits major 9, 10 and 12: an SM103 or
# SM121 GPU passes it but finds no kernel in the vLLM build.
SMS = {VLLM: (90, 100, 120), STANDALONE: (90, 100, 103, 107, 120)}

HEAD_DIM = 128  # "Currently requires K = V = 128" (flash_kda/__init__.py docstring); only launch_fwd<128, ...>
LOWER_BOUND_RANGE = (-5.0, 0.0)  # "Gate lower bound, expected in [-5.0, 0]"


def floors(backend: str, op: str, env: Env) -> Verdict:
    unmet: list[str] = []
    notes: list[str] = []
    if not env.cuda:
        unmet.append(no_cuda_reason(env))
    elif env.sm is not None and env.sm not in SMS[backend]:
        unmet.append(f"needs one of SM{', SM'.join(map(str, SMS[backend]))} (the cubins its binary carries; no PTX), "
                     f"this GPU is {env.device()}")
    package_floor(env.version(VERSION_KEYS[backend]), DISTS[backend], FLOORS[backend],
                  f"the first release with {ENTRY[backend]}", INSTALL[backend], unmet, notes)
    return gathered(f"{backend}:{op}", unmet, notes,
                    backward_reason="FlashKDA is a forward kernel (no autograd); use fla or cudnn for KDA gradients")


def _envelope(backend: str) -> Envelope:
    # The kernel always l2-normalizes q and k, applies sigmoid to beta logits and computes the bounded gate
    # lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) itself: a case without any of these cannot be expressed.
    return Envelope(f"{backend} fwd", "kda", backward=False, sms=SMS[backend], allowed={
        "io_dtype": ("bf16",), "dims": (f"{HEAD_DIM}x{HEAD_DIM}",), "heads": ("mha",),
        "gate_mode": ("safe", "safe_alog", "safe_dtbias", "safe_alog_dtbias"), "beta_mode": ("sigmoid",),
        "l2norm": ("on",), "guard": ("off",),
    }, source=f"{MODULES[backend]} (the binary's TORCH_CHECKs; vllm/models/kimi_k3/nvidia/kda.py _flashkda_prefill)")


ENVELOPES = {VLLM: _envelope(VLLM), STANDALONE: _envelope(STANDALONE)}


def envelopes(backend: str, op: str, sm: int | None = None) -> list[Envelope]:
    envelope = ENVELOPES[backend]
    if op != envelope.op or (sm is not None and sm not in SMS[backend]):
        return []
    return [envelope]

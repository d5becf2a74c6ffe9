"""jax-linear-attention facts: the distribution, the entry point, our floors and what the Mosaic GPU kernels
serve — from the ``Env`` alone, without importing JAX. The adapter (``adapter.py``) asks these first, then jla.

Sources (the jax-linear-attention 0.1.0 wheel, package ``jla``; docs/libraries.md keeps the file:line details):
``jla/ops/__init__.py`` (``linear_attention(kind, q, k, v, impl=..., **gates)``, the kinds), the kernels'
``unsupported_reason`` in ``jla/ops/mosaic_gpu/scalar_gate.py`` (GDN, and GDP interleaved onto it),
``scalar_gate_kb.py`` (GDN's large heads) and ``vector_gate_ops.py`` / ``vector_gate.py`` (KDA, GDN2), and
``jla/ops/mosaic_gpu/_common.py`` (``is_hopper``: compute capability exactly 9.0; dtypes; head dims).
"""

from __future__ import annotations

from deltacheck.cases.envelope import Envelope
from deltacheck.harness.machine.environment import Env
from deltacheck.plugin import gathered, no_cuda_reason, package_floor

from ..base import Verdict

DIST = "jax-linear-attention"
INSTALL = "pip install 'jax-linear-attention==0.1.0' 'jax[cuda13]==0.11.2'"
INSTALL_HINT = f"jax-linear-attention is not installed ({INSTALL})"
FLOOR = "0.1.0"
JAX_PIN = "0.11.2"  # jla 0.1.0's METADATA: Requires-Dist jax==0.11.2 (Pallas Mosaic GPU moves between releases)
HOPPER_SM = 90  # _common.py is_hopper(): compute_capability == "9.0" exactly; SM100 is not served

MODULE = "jla.ops"
ENTRY_POINT = "linear_attention"
IMPL = "mosaic_gpu"  # by name: impl="auto" would fall back to jla's chunked JAX or its scan without a word
# Our op -> jla's kind (jla/ops/__init__.py KINDS) and the gate keywords in its order.
KINDS = {
    "gdn": ("gated_deltanet", ("g", "beta")),
    "kda": ("kda", ("g", "beta")),
    "gdn2": ("gdn2", ("g", "b", "w")),  # b is our beta (the erase gate [T, H, K]); w the write gate
    "gdp": ("gated_deltaproduct", ("g", "beta")),
}

# Head dims (K, V) per op. GDN: scalar_gate.py (K, V each in _common.SUPPORTED_HEAD_DIMS = (64, 128)) plus
# scalar_gate_kb.py HEAD_DIMS for large heads; GDP: the interleaved call on scalar_gate.py only (no kb path);
# KDA / GDN2: vector_gate_ops.py unsupported_reason (K, V in {64, 128}).
_SMALL = tuple((k, v) for k in (64, 128) for v in (64, 128))
HEAD_DIMS = {
    "gdn": _SMALL + ((256, 128), (256, 256), (256, 512), (128, 256)),
    "kda": _SMALL,
    "gdn2": _SMALL,
    "gdp": _SMALL,
}
IO_DTYPES = {"gdn": ("bf16", "fp16"), "gdp": ("bf16", "fp16"), "kda": ("bf16",), "gdn2": ("bf16",)}

FLOORS = {DIST: FLOOR, "jax": f"=={JAX_PIN}", "GPU": "SM90 exactly (jla's is_hopper)"}


def floors(backend: str, op: str, env: Env) -> Verdict:
    """Our floors for ``jax:op`` on ``env``: CUDA on SM90, jla >= 0.1.0 and the JAX it pins."""
    pair = f"{backend}:{op}"
    unmet: list[str] = []
    notes: list[str] = []
    if not env.cuda:
        unmet.append(no_cuda_reason(env))
    elif env.sm is not None and env.sm != HOPPER_SM:
        unmet.append(f"needs an SM90 GPU, found {env.device()}: jla's Mosaic GPU kernels register for "
                     "compute capability 9.0 only (jla/ops/mosaic_gpu/_common.py is_hopper)")
    package_floor(env.version("jax_linear_attention"), DIST, FLOOR, "the first release", INSTALL, unmet, notes)
    jax_version = env.version("jax")
    if jax_version is None:
        unmet.append(f"jax is not installed; pip install 'jax[cuda13]=={JAX_PIN}'")
    elif jax_version != JAX_PIN:
        notes.append(f"jax {jax_version} is not the {JAX_PIN} jla 0.1.0 pins; its Pallas Mosaic GPU API may differ")
    return gathered(pair, unmet, notes)


# Envelopes: what the kernels' own predicates accept (read from the sources above). Forward and backward alike:
# every kind registers a custom VJP on the same kernels. The lengths axis: jla takes no cu_seqlens
# (scalar_gate.py "cu_seqlens is not supported"), so only equal-length sequences (a batch) are served.
_DIMS_AXIS = {"gdn": ("64x64", "128x128", "64x128", "128x64"), "kda": ("64x64", "128x128", "64x128", "128x64")}
_COMMON = {"gate_mode": ("log",), "beta_mode": ("plain",), "guard": ("off",),
           "lengths": ("one", "batch")}


# GVA: the scalar-gate kinds (GDN, GDP) take v at a multiple of q/k's heads (scalar_gate.py); the vector-gate
# kinds (KDA, GDN2) need q, k, v and the gates at one head count (vector_gate_ops.py unsupported_reason:
# v.shape[:3] == q.shape[:3]).
_HEADS = {"gdn": ("mha", "gva"), "gdp": ("mha", "gva"), "kda": ("mha",), "gdn2": ("mha",)}


def _envelope(op: str, source: str) -> Envelope:
    dims = _DIMS_AXIS["gdn"] if op in ("gdn", "gdp") else _DIMS_AXIS["kda"]
    return Envelope(f"jax {KINDS[op][0]}", op, allowed={**_COMMON, "heads": _HEADS[op], "dims": dims,
                                                         "io_dtype": IO_DTYPES[op]},
                    sms=(HOPPER_SM,), source=source)


ENVELOPES = {
    "gdn": _envelope("gdn", "jla/ops/mosaic_gpu/scalar_gate.py unsupported_reason"),
    "kda": _envelope("kda", "jla/ops/mosaic_gpu/vector_gate_ops.py unsupported_reason"),
    "gdn2": _envelope("gdn2", "jla/ops/mosaic_gpu/vector_gate_ops.py unsupported_reason"),
    "gdp": _envelope("gdp", "jla/ops/mosaic_gpu/gated_delta_product.py _reason -> scalar_gate.py"),
}

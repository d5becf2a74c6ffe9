"""FlashQLA facts: distributions, the entry point, floors and the envelope — from the ``Env`` alone, without
importing FlashQLA (its import JIT-probes the GPU through TileLang). The adapter (``adapter.py``) asks these
first, then the library.

Sources (flash-qla 0.1.3, tilelang 0.1.15 wheels; docs/libraries.md "FlashQLA" has each line):
``flash_qla/ops/gated_delta_rule/chunk/__init__.py`` (the arch switch :14-30, the public entry point :314-469 and
its asserts :416-439), ``chunk/hopper/fused_fwd.py:662`` / ``fused_bwd.py:1148`` (K == V == 128), the two
wheels' METADATA (``tilelang>=0.1.12``; ``apache-tvm-ffi<0.1.13,>=0.1.11``, ``z3-solver<4.15.5,>=4.13.0``).
"""

from __future__ import annotations

from deltacheck.cases.envelope import Envelope
from deltacheck.harness.machine.environment import Env, version_in
from deltacheck.plugin import gathered, no_cuda_reason, package_floor

from ..base import Verdict

DIST = "flash-qla"
MODULE, ENTRY = "flash_qla", "chunk_gated_delta_rule"  # flash_qla/__init__.py:6-10 re-exports it
INSTALL = "pip install 'flash-qla>=0.1.3' (brings tilelang; TileLang JIT-compiles with nvcc: CUDA_HOME or nvcc on PATH)"
INSTALL_HINT = f"flash-qla is not installed ({INSTALL})"
FLOOR = "0.1.3"  # the API the adapter was written against (auto_cp, state_v_first, force_intra_cp)
TILELANG_FLOOR = "0.1.12"  # flash-qla 0.1.3 METADATA: Requires-Dist tilelang>=0.1.12
TVM_FFI_RANGE = ">=0.1.11,<0.1.13"  # tilelang 0.1.15 METADATA (cuDNN FE 1.32 brings 0.1.15: not one environment)
Z3_RANGE = ">=4.13.0,<4.15.5"  # tilelang 0.1.15 METADATA; tilelang/env.py imports z3 at import

# flash_qla/ops/gated_delta_rule/chunk/__init__.py:14-30 picks kernels by TileLang's target compute version; SM120/121
# get blackwell_sm120, which FLA dispatches to for grad-free bf16 calls only (fla/ops/gated_delta_rule/backends/
# flash_qla.py:52-54, 84-95). The adapter covers the fwd+bwd architectures.
SMS = (90, 100, 103)
HEAD_DIM = 128  # hopper/fused_fwd.py:662, fused_bwd.py:1148, kkt_solve.py:292: assert K == V == 128
IO_DTYPES = ("bf16", "fp16")  # chunk/__init__.py:416-419: q, k, v one dtype, bfloat16 or float16

FLOORS = {DIST: FLOOR, "tilelang": TILELANG_FLOOR, "apache-tvm-ffi": TVM_FFI_RANGE, "z3-solver": Z3_RANGE,
          "GPU": "SM " + "/".join(map(str, SMS))}

# What the entry point can express (docs/libraries.md): GVA but no GQA (v.shape[2] % k.shape[2] == 0, :421; q and
# k share Hg heads), a log-space gate only (g "in log space", :343-344; no in-kernel gate), beta post-activation
# (no sigmoid, no negative eigenvalues), l2norm in kernel, any scale, an initial state, every layout the adapter
# converts to [B, T, H, D].
ENVELOPE = Envelope(
    "flash_qla chunk_gated_delta_rule", "gdn", sms=SMS,
    allowed={"heads": ("mha", "gva"), "dims": ("128x128",), "io_dtype": IO_DTYPES, "gate_mode": ("log",),
             "beta_mode": ("plain",), "guard": ("off",)},
    source="flash_qla/ops/gated_delta_rule/chunk/__init__.py:314-469; chunk/hopper/fused_fwd.py:662",
)


def _range(version: str | None, dist: str, spec: str, why: str, unmet: list[str], notes: list[str]) -> None:
    if version is None:
        unmet.append(f"{dist} is not installed ({why}); pip install '{dist}{spec}'")
        return
    inside = version_in(version, spec)
    if inside is None:
        notes.append(f"{dist} version {version!r} is unreadable; the {spec} range was not checked")
    elif not inside:
        unmet.append(f"{dist} {version} is outside {spec} ({why}); pip install '{dist}{spec}' "
                     "(in an environment without cuDNN FE 1.32, which needs apache-tvm-ffi 0.1.15)")


def floors(backend: str, op: str, env: Env) -> Verdict:
    """Our floors for ``flashqla:gdn``: CUDA on SM90/100/103, flash-qla and tilelang at their floors, and TileLang's
    own pins of apache-tvm-ffi and z3-solver (the conflict with cuDNN FE shows here, before any import)."""
    pair = f"{backend}:{op}"
    unmet: list[str] = []
    notes: list[str] = []
    if op != "gdn":
        return Verdict.no(f"{pair}: FlashQLA 0.1.3 implements GDN only (flash_qla.chunk_gated_delta_rule)")
    if not env.cuda:
        unmet.append(no_cuda_reason(env))
    elif env.sm not in SMS:
        unmet.append(f"FlashQLA's forward+backward kernels are built for SM{'/'.join(map(str, SMS))} "
                     f"(flash_qla/ops/gated_delta_rule/chunk/__init__.py:14-30); this is {env.device()}")
    package_floor(env.version("flash_qla"), DIST, FLOOR, "the adapter targets 0.1.3's API", INSTALL, unmet, notes)
    package_floor(env.version("tilelang"), "tilelang", TILELANG_FLOOR, "flash-qla 0.1.3 requires it",
                  "pip install 'tilelang>=0.1.12'", unmet, notes)
    if env.version("tilelang") is not None:
        _range(env.version("tvm_ffi"), "apache-tvm-ffi", TVM_FFI_RANGE, "tilelang 0.1.15 pins it", unmet, notes)
        _range(env.version("z3"), "z3-solver", Z3_RANGE, "tilelang 0.1.15 pins it", unmet, notes)
    return gathered(pair, unmet, notes)


def envelopes(op: str, env: Env | None = None, sm: int | None = None) -> list[Envelope]:
    """FlashQLA's envelope for ``op`` on ``sm`` (or ``env``'s GPU): GDN on SM90/100/103, else none."""
    if op != "gdn":
        return []
    if env is not None:
        if not env.cuda:
            return []
        sm = env.sm
    if sm is not None and sm not in SMS:
        return []
    return [ENVELOPE]

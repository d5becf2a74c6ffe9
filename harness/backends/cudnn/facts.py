"""cuDNN frontend facts: the distribution, entry points, version floors and engine requirements — from the
``Env`` alone, without importing cuDNN. The adapter (``adapter.py``) asks these first, then the library.

Sources (read in the nvidia-cudnn-frontend 1.30–1.32 wheels; docs/libraries.md keeps the details):
``cudnn/frost/buffers.py`` (``CUTEDSL_MIN_VERSION``), ``cudnn/frost/engine.py`` (FROST's SM check),
``cudnn/linear_attention/cutile/engine.py`` (``CUTILE_MIN_CUDART``), FE's ``cutile`` extra (cuda-tile >= 1.4).

Policy for known-wrong versions: a version *below a floor* (its kernels are known to return garbage for
every case, FE < 1.29 GDN NaNs) declines. A version wrong only in a known corner (FE < 1.32 GDN2 steep-decay
NaNs) stays runnable with a ``KNOWN-WRONG`` note, so release qualification can still measure it.
"""

from __future__ import annotations

import os
from dataclasses import replace

from deltacheck.cases.envelope import Envelope
from deltacheck.harness.machine.environment import Env, version_below
from deltacheck.plugin import gathered, no_cuda_reason

from ..base import Verdict

DIST = "nvidia-cudnn-frontend"
INSTALL = "pip install -U 'nvidia-cudnn-frontend>=1.32'"
INSTALL_HINT = "nvidia-cudnn-frontend is not installed (pip install 'deltacheck[cudnn]')"

NAN_FLOOR = "1.29"  # GDN/GDN2 kernels below 1.29 can return NaN: decline
GDN2_STEEP_FIX = "1.32"  # GDN2 NaN under steep per-channel decay fixed in 1.32: note, still runnable
HOPPER_KDA = "1.30"  # the two SM90 KDA engines (kda_hopper, kda_hopper_cuda) exist from 1.30
CUTLASS_DSL_FLOOR = "4.7.0"  # FROST's runtime check, cudnn/frost/buffers.py CUTEDSL_MIN_VERSION
FROST_SMS = (100, 101, 102, 103, 107)  # cudnn/frost/engine.py: 100 <= sm <= 103 or sm == 107
HOPPER_SM = 90
CUTILE_MIN_CUDART = "13.3"  # cudnn/linear_attention/cutile/engine.py CUTILE_MIN_CUDART = 13030
CUDA_TILE_FLOOR = "1.4"  # FE's `cutile` extra pins cuda-tile>=1.4

# op -> the cudnn.linear_attention entry point (lazy exports of cudnn/linear_attention/__init__.py).
MODULE = "cudnn.linear_attention"
ENTRY_POINTS = {
    "gdn": "gated_delta_net",
    "kda": "kimi_delta_attention",
    "gdn2": "gated_delta_net_v2",
    "gdp": "gated_delta_product",  # GDP: num_householder is its 7th positional argument
}

FLOORS = {
    f"{DIST} (gdn, gdn2: NaN below)": NAN_FLOOR,
    f"{DIST} (gdn2 steep-decay fix; below = KNOWN-WRONG note)": GDN2_STEEP_FIX,
    f"{DIST} (kda Hopper engines)": HOPPER_KDA,
    "nvidia-cutlass-dsl (FROST)": CUTLASS_DSL_FLOOR,
    "FROST SMs": FROST_SMS,
    "CUDA runtime (cuTile)": CUTILE_MIN_CUDART,
    "cuda-tile (cuTile)": CUDA_TILE_FLOOR,
}


def _frost_arch(env: Env) -> str:
    return (
        f"needs SM100/101/102/103/107 (Blackwell, FROST engines) — found {env.device()}; "
        "run on a B200/GB200/B300 runner"
    )


def _cutlass_dsl_unmet(env: Env, who: str = "FROST engines") -> list[str]:
    """Mirrors FROST's own check: the module must resolve, and the public wheel must be >= 4.7.0
    (an internal build's numbering, or an unreadable version, is not judged). kda_hopper (CuTe DSL too) imports
    the same package (hopper/kda_engine.py declines on its ImportError); its issue measured it with 4.8.1."""
    v = env.version("cutlass_dsl")
    fix = "pip install -U 'nvidia-cutlass-dsl>=4.7'"
    if not env.importable.get("cutlass", False):
        found = f" (the {v} distribution is installed but `cutlass` does not resolve)" if v else " is not installed"
        return [f"nvidia-cutlass-dsl{found}; {who} need it; {fix}"]
    if version_below(v, CUTLASS_DSL_FLOOR):
        return [f"nvidia-cutlass-dsl {v} < {CUTLASS_DSL_FLOOR} ({who} fail to compile); {fix}"]
    return []


def _major_minor(version: str | None) -> str | None:
    parts = (version or "").split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else None


def toolchain_unmet(env: Env) -> list[str]:
    """The cuTile compiler chain: tileiras, and the ptxas and libnvvm it will use, all of one release (a 13.0
    libnvvm or ptxas under a 13.4 tileiras fails every kernel with rc 5, "failed to compile Tile IR program",
    at the first execute — cuDNN does not decline it). What tileiras will use is the probe's reading of
    ``CUDA_HOME`` (harness/machine/environment.py ``_tileiras_toolchain``); each reason names the variable or file to fix."""
    path = env.tools.get("tileiras")
    if not path:
        return ["tileiras not found (not in nvidia-cuda-tileiras, on PATH or in $CUDA_HOME/bin; cuTile compiles with it); "
                "pip install 'cuda-tile[tileiras]' or put a CUDA 13.3+ toolkit's bin/ on PATH"]
    tv = env.version("tileiras")
    if tv is None:
        return [f"tileiras at {path} does not run (`{path} --version` failed); reinstall nvidia-cuda-tileiras"]
    release = _major_minor(tv)
    if release is None:
        return []  # an unreadable tileiras banner: the chain is not judged
    home = env.tools.get("cuda_home")
    own = os.path.dirname(os.path.dirname(path))
    unmet = []
    for name in ("ptxas", "libnvvm"):
        if name not in env.tools:
            continue  # an Env recorded before the probe looked (older run headers): not judged
        found, want = env.tools[name], f"{name} {release}"
        if home:
            fix = (f"CUDA_HOME={home} makes tileiras take ptxas and libnvvm from there, ignoring its own: "
                   f"unset CUDA_HOME, or point it at a CUDA {release} tree (e.g. {own})")
        elif name == "ptxas":
            fix = f"put ptxas {release} at {own}/bin/ptxas (pip install 'nvidia-cuda-nvcc=={tv}')"
        else:
            fix = f"put libnvvm {release} at {own}/nvvm/lib64/libnvvm.so or {own}/lib/libnvvm.so.4 (pip install 'nvidia-nvvm=={tv}')"
        if not found:
            where = f"$CUDA_HOME ({home})" if home else f"beside tileiras ({own})"
            unmet.append(f"no {name} where tileiras {tv} looks, {where}: cuTile kernels cannot compile; {fix}")
            continue
        got = env.version(name)
        if _major_minor(got) not in (None, release):
            unmet.append(f"{name} {got} at {found} does not match tileiras {tv} (tileiras needs {want}; a mismatch "
                         f"fails every kernel with rc 5 \"failed to compile Tile IR program\" at the first call); {fix}")
    return unmet


def _cutile_unmet(env: Env) -> list[str]:
    unmet = []
    cudart = env.version("cudart") or env.version("cuda_runtime")
    src = "cuda-bindings" if env.version("cudart") else "torch.version.cuda"
    old = version_below(cudart, CUTILE_MIN_CUDART)
    if old is None:
        unmet.append(
            "CUDA runtime version unknown (cuda-bindings absent); cuTile needs >= 13.3; "
            "pip install 'cuda-bindings>=13.3' (and a CUDA 13.3+ driver)"
        )
    elif old:
        unmet.append(
            f"CUDA runtime {cudart} ({src}) < {CUTILE_MIN_CUDART} (cuTile engines); "
            "use a CUDA 13.3+ runtime: pip install 'cuda-bindings>=13.3' with a 13.3+ driver"
        )
    tile = env.version("cuda_tile")
    if tile is None or not env.importable.get("cuda.tile", False):
        what = f"cuda-tile {tile} is installed but `cuda.tile` does not resolve" if tile else "cuda-tile is not installed"
        unmet.append(f"{what} (cuTile engines); pip install 'cuda-tile[tileiras]>=1.4'")
    elif version_below(tile, CUDA_TILE_FLOOR):
        unmet.append(f"cuda-tile {tile} < {CUDA_TILE_FLOOR} (cuTile engines); pip install -U 'cuda-tile>=1.4'")
    return unmet + toolchain_unmet(env)


def _frontend_floors(op: str, env: Env, unmet: list[str], notes: list[str]) -> None:
    """The nvidia-cudnn-frontend version floors of ``op`` (every engine of it shares them)."""
    fe = env.version("cudnn_frontend")
    if fe is None:
        unmet.append(f"{DIST} is not installed; {INSTALL}")
    elif version_below(fe, NAN_FLOOR) is None:
        notes.append(f"{DIST} version {fe!r} is unreadable; version floors were not checked")
    elif op in ("gdn", "gdn2") and version_below(fe, NAN_FLOOR):
        unmet.append(f"{DIST} {fe} < {NAN_FLOOR} ({op.upper()} kernels can return NaN); {INSTALL}")
    elif op == "gdn2" and version_below(fe, GDN2_STEEP_FIX):
        notes.append(
            f"KNOWN-WRONG: {DIST} {fe} < {GDN2_STEEP_FIX}: GDN2 returns NaN under steep "
            f"per-channel decay (fixed in 1.32); measured, not trusted; {INSTALL}"
        )


def nvrtc_unmet(env: Env, who: str = "kda_hopper_cuda") -> list[str]:
    """What FE's NVRTC-compiled engine needs: a CUDA include tree NVRTC can compile the kernel against
    (hopper/cuda_engine.py declines only when no cuda_bf16.h is found; a tree lacking ``crt/mma.h`` passes that
    check and then fails to compile at the first call). Not judged for an Env recorded before the probe looked."""
    if "nvrtc_include" not in env.tools:
        return []
    include, missing = env.tools.get("nvrtc_include"), env.tools.get("nvrtc_include_missing")
    fix = ("set CUDAToolkit_ROOT to a full CUDA toolkit (e.g. /usr/local/cuda; FE's NVRTC compiler reads it after "
           "CUDA_HOME and CUDA_PATH, and neither cuda.tile nor tileiras reads it, so it leaves an unset CUDA_HOME unset)")
    if include is None:
        return [f"no CUDA include tree with cuda_bf16.h for NVRTC ({who} compiles its kernel at the first call); {fix}"]
    if missing:
        return [f"the NVRTC include tree {include} lacks {missing} ({who} fails to compile: NVRTC \"cannot open source "
                f"file \"{missing}\"\", measured on an H200 with CUDA_HOME unset and the pip nvidia/cu13/include "
                f"picked); {fix}"]
    return []


def floors(backend: str, op: str, env: Env) -> Verdict:
    """Our floors and facts for ``cudnn:op`` on ``env``; cuDNN's own planner still decides per case."""
    pair = f"{backend}:{op}"
    unmet: list[str] = []
    notes: list[str] = []
    if not env.cuda:
        unmet.append(no_cuda_reason(env))
    _frontend_floors(op, env, unmet, notes)
    fe = env.version("cudnn_frontend")

    # Engines: a pair runs when at least one engine family has everything it needs.
    sm = env.sm
    on_blackwell = env.cuda and sm in FROST_SMS
    if op in ("gdn2", "gdp"):  # FROST only (gdp_frost is GDP's one engine, cudnn/linear_attention/frost/gdp_engine.py)
        if env.cuda and not on_blackwell:
            unmet.append(_frost_arch(env))
        unmet += _cutlass_dsl_unmet(env)
        return gathered(pair, unmet, notes)

    paths: dict[str, list[str]] = {}
    if on_blackwell or not env.cuda:
        paths["FROST"] = _cutlass_dsl_unmet(env)
    paths["cuTile"] = _cutile_unmet(env)
    if op == "kda" and (sm == HOPPER_SM or not env.cuda):
        hop: list[str] = []
        if version_below(fe, HOPPER_KDA):
            hop.append(f"{DIST} {fe} < {HOPPER_KDA} (no Hopper KDA engines before 1.30); {INSTALL}")
        # kda_hopper_cuda (NVRTC) or kda_hopper (CuTe DSL): the path holds if either can build
        if not hop and nvrtc_unmet(env) and _cutlass_dsl_unmet(env, "kda_hopper (CuTe DSL)"):
            hop += nvrtc_unmet(env) + _cutlass_dsl_unmet(env, "kda_hopper (CuTe DSL)")
        paths["Hopper"] = hop
    if not any(not u for u in paths.values()):
        if env.cuda:
            excluded = [] if on_blackwell else ["FROST (needs SM100/101/102/103/107)"]
            if op == "kda" and sm != HOPPER_SM:
                excluded.append("Hopper (needs SM90)")
            scope = f"on {env.device()}" + (f", {' and '.join(excluded)} excluded" if excluded else "")
        else:
            scope = "even with a GPU"
        parts = [f"{name} needs: {'; '.join(u)}" for name, u in paths.items()]
        unmet.append(f"no engine can run {scope} — " + " || ".join(parts))
    return gathered(pair, unmet, notes)


# --------------------------------------------------------------------------------------------------
# Envelopes: which cases each engine serves, read in FE 1.32's per-engine check_support (paths below are inside
# cudnn/linear_attention/). The library's planner stays authoritative at run time; a disagreement is noted.

_FROST_DIMS = ("64x64", "128x128", "64x128", "128x64")  # frost/*_engine.py: K, V each in {64, 128}
_SAFE = ("safe", "safe_alog", "safe_dtbias", "safe_alog_dtbias")


def _frost(op: str) -> Envelope:
    return Envelope(f"cudnn {op}_frost", op, allowed={"dims": _FROST_DIMS}, sms=FROST_SMS,
                    source=f"frost/{op}_engine.py check_support, frost/engine.py frost_la_gate")


_CUTILE_COMMON = {
    "heads": ("mha", "gva"),  # cutile/engine.py: HK == H and HV % H == 0 ("GQA-style v broadcast is FROST-only")
    "state_dtype": ("fp32",),  # cutile/engine.py: states fp32 only
    "gate_mode": ("log", *_SAFE),  # no gate_domain='linear'
}

ENVELOPES: dict[str, tuple[Envelope, ...]] = {
    "gdn": (
        _frost("gdn"),
        Envelope("cudnn gdn_cutile", "gdn", allowed={**_CUTILE_COMMON, "beta_mode": ("plain",)},
                 backward_allowed={"gate_mode": ("log",)}, needs="cutile",  # "safe_gate is forward-only"
                 source="cutile/gdn_engine.py check_support, cutile/engine.py cutile_la_gate"),
    ),
    "kda": (
        _frost("kda"),
        Envelope("cudnn kda_hopper_cuda", "kda", sms=(HOPPER_SM,), allowed={
            "io_dtype": ("bf16",), "dims": ("128x128",), "heads": ("mha", "gva"),
            "gate_mode": ("log", "safe_alog_dtbias"),  # safe_gate only with both a_log and dt_bias
            "beta_mode": ("plain", "sigmoid"),  # allow_neg_eigval declined
        }, backward_allowed={
            "heads": ("mha",), "l2norm": ("off",), "beta_mode": ("plain",), "gate_mode": ("log",),
            "scale": ("default",),  # the backward takes pre-normalized q/k, post-sigmoid beta, 1/sqrt(128)
        }, source="hopper/cuda_engine.py check_support"),
        Envelope("cudnn kda_hopper", "kda", sms=(HOPPER_SM,), backward=False, allowed={
            "io_dtype": ("bf16",), "dims": ("128x128",), "heads": ("mha",), "state_dtype": ("fp32",),
            "l2norm": ("off",), "beta_mode": ("plain",), "gate_mode": ("log",), "scale": ("default",),
        }, needs="cutedsl", source="hopper/kda_engine.py check_support"),
        Envelope("cudnn kda_cutile", "kda", allowed={**_CUTILE_COMMON, "beta_mode": ("plain", "sigmoid")},
                 backward_allowed={"gate_mode": ("log",), "beta_mode": ("plain",),
                                   "dims": ("128x128", "64x128")},  # the backward needs V == 128
                 needs="cutile", source="cutile/kda_engine.py check_support"),
    ),
    "gdn2": (_frost("gdn2"),),  # FROST only: no cuTile, no Hopper engine
    "gdp": (_frost("gdp"),),  # gdp_frost only (frost/gdp_engine.py: GdpFrostEngine, K and V in {64, 128})
}


def runtimes(env: Env) -> frozenset[str]:
    """The optional runtimes this machine has that some engine needs beyond its architecture: ``cutile`` (the
    cuda.tile runtime, a 13.3+ cudart and a consistent tileiras toolchain), ``cutedsl`` (nvidia-cutlass-dsl, for
    kda_hopper)."""
    if not env.cuda:
        return frozenset()
    present = set()
    if not _cutile_unmet(env):
        present.add("cutile")
    if not _cutlass_dsl_unmet(env):
        present.add("cutedsl")
    return frozenset(present)


def envelopes(op: str, sm: int | None = None, present: frozenset[str] | None = None) -> list[Envelope]:
    """The engines that serve ``op`` on architecture ``sm`` with the ``present`` runtimes (None: any)."""
    return [e for e in ENVELOPES.get(op, ()) if e.applies(sm, present)]


# --------------------------------------------------------------------------------------------------
# One engine at a time: the ``cudnn@<engine>`` backends pin ``plan_name=<engine>`` (ops/common.py select_plan: a
# strict pin, a decline raises cudnnGraphNotSupportedError listing the plans offered). The engines of FE 1.32's
# manifest (cudnn/engines/manifest.py) that serve a training op; the summaries and kda_cake (opt-in behind
# CUDNN_FRONTEND_ENABLE_FROST_ENGINES, SM100/103 only, its forward "not reconciled" with FLA) are left out.
ENGINES = {
    "gdn_frost": "gdn",
    "gdn_cutile": "gdn",
    "kda_frost": "kda",
    "kda_cutile": "kda",
    "kda_hopper": "kda",
    "kda_hopper_cuda": "kda",
    "gdn2_frost": "gdn2",
    "gdp_frost": "gdp",
}


# The engines whose check_support takes fp32 states only and leaves the conversion to the caller: cutile/engine.py
# cutile_la_gate ("'initial_state' must be fp32 (callers convert)"), hopper/kda_engine.py check_support ("'initial_state'
# must be fp32"). Their pinned backends convert a bf16 state as asked (exact; noted on the result), so a continuation
# that carries its state in bf16 is judged instead of refused, and their envelopes admit a bf16 state.
FP32_STATE_ENGINES = frozenset({"gdn_cutile", "kda_cutile", "kda_hopper"})


def engine_backend(engine: str) -> str:
    """The backend name that pins ``engine``: ``cudnn@gdn_cutile``."""
    return f"cudnn@{engine}"


def engine_verdict(engine: str, env: Env) -> Verdict:
    """Our floors for the one engine ``engine`` (its op's FE floors, then what that engine alone needs)."""
    op = ENGINES[engine]
    unmet: list[str] = []
    notes: list[str] = []
    if not env.cuda:
        unmet.append(no_cuda_reason(env))
    _frontend_floors(op, env, unmet, notes)
    sm = env.sm
    if engine.endswith("_frost"):
        if env.cuda and sm not in FROST_SMS:
            unmet.append(_frost_arch(env))
        unmet += _cutlass_dsl_unmet(env)
    elif engine.endswith("_cutile"):
        unmet += _cutile_unmet(env)
    else:  # kda_hopper (CuTe DSL), kda_hopper_cuda (NVRTC)
        if env.cuda and sm != HOPPER_SM:
            unmet.append(f"{engine} needs SM90 (Hopper) — found {env.device()}; run on an H100/H200 runner")
        if version_below(env.version("cudnn_frontend"), HOPPER_KDA):
            unmet.append(f"{DIST} {env.version('cudnn_frontend')} < {HOPPER_KDA} (no {engine} before 1.30); {INSTALL}")
        if engine == "kda_hopper":
            unmet += _cutlass_dsl_unmet(env, "kda_hopper (CuTe DSL)")
        else:
            unmet += nvrtc_unmet(env)
    return gathered(f"{engine_backend(engine)}:{op}", unmet, notes)


def engine_envelopes(engine: str, sm: int | None = None, present: frozenset[str] | None = None) -> list[Envelope]:
    """The one envelope of ``engine`` (read from its own check_support), where it applies."""
    found = [e for e in envelopes(ENGINES[engine], sm, present) if e.name == f"cudnn {engine}"]
    if engine in FP32_STATE_ENGINES:  # the pinned backend converts a bf16 state (FP32_STATE_ENGINES)
        found = [replace(e, allowed={k: v for k, v in e.allowed.items() if k != "state_dtype"}) for e in found]
    return found

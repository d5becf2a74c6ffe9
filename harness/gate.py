"""The arch/runtime gate: what this machine has, which backend × op pairs can run, and required mode.

Public contract (the runner, the adapters, the pytest plugin and the CLI all call these; every
function below is pure except ``probe_env()`` without arguments, which probes the real machine once
per process and caches the snapshot):

- ``Env``: a frozen snapshot of the machine. ``probe_env()`` builds it for the real machine;
  ``probe_env(finder=Fake())`` builds it from a fake (tests); ``Env(...)`` / ``Env.from_dict(d)``
  build it directly. ``Env.to_dict()`` is what run headers record.
- ``pair_verdict(backend, op, env) -> Verdict``: our floors and facts for a fused pair, from the Env
  alone (no library import). Every unmet requirement is gathered into one reason; each names the
  cause and the fix. ``cudnn``, ``fla`` and ``fla-recurrent`` are gated; any other backend gets ``Verdict.ok()``
  (a third-party ``pkg.mod:attr`` backend's own ``check()`` decides).
- ``load_op(backend, op, importer=...) -> (fn | None, Verdict)``: import the library and fetch the
  op's entry point, turning "raises on import" and "op attribute missing" into declines with a fix.
  ``check_pair`` = ``pair_verdict`` + ``load_op``, merged. ``floors_then_library(backend, op, env, library)``:
  the order a fused adapter's ``check`` follows — ``pair_verdict``, and only if it holds the library's say.
- ``required_pairs(environ) -> set[(backend, op)]`` / ``required_spec(environ) -> {pair: source}``;
  malformed entries raise ``RequireSpecError`` (a ``RequiredModeError``).
- ``required_failures(required, gate_verdicts, executed, declined=None) -> list[str]``: one loud
  line per required pair that cannot run, or ran zero cases; ``format_required_report(failures)`` is
  the text both the CLI and the pytest plugin print, so they agree by construction.

Policy for known-wrong library versions (decided here, issue #6): a version *below a floor* (the
library is known to return garbage for every case, e.g. FE < 1.29 GDN NaNs) declines. A version that
is wrong only in a known corner (FE < 1.32 GDN2 steep-decay NaNs) stays runnable and carries a
``KNOWN-WRONG`` note in ``Verdict.notes``, so release qualification can still measure it and the
report shows why its steep-decay cases fail.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Any

from deltacheck.cases.support import OPS

from .backends.base import Verdict

__all__ = [
    "ENTRY_POINTS",
    "FLOORS",
    "Env",
    "Finder",
    "RequireSpecError",
    "RequiredModeError",
    "add_cli",
    "check_pair",
    "format_required_report",
    "gate_verdicts",
    "floors_then_library",
    "load_op",
    "merge_verdicts",
    "pair_verdict",
    "probe_env",
    "required_failures",
    "required_pairs",
    "required_spec",
]

# --------------------------------------------------------------------------------------------------
# Facts and floors (sources: .notes/libs.md, read from the FE 1.30-1.32 and fla-core 0.6.0 wheels).

GATED_BACKENDS = ("cudnn", "fla", "fla-recurrent")  # fla-recurrent: FLA's fused_recurrent_* (forward only)

FE_DIST = "nvidia-cudnn-frontend"
FE_INSTALL = "pip install -U 'nvidia-cudnn-frontend>=1.32'"
FE_NAN_FLOOR = (1, 29)  # GDN/GDN2 kernels below 1.29 can return NaN: decline
FE_GDN2_STEEP_FIX = (1, 32)  # GDN2 NaN under steep per-channel decay fixed in 1.32: note, still runnable
FE_HOPPER_KDA = (1, 30)  # the two SM90 KDA engines (kda_hopper, kda_hopper_cuda) exist from 1.30
CUTLASS_DSL_DIST = "nvidia-cutlass-dsl"
CUTLASS_DSL_FLOOR = (4, 7, 0)  # FROST runtime check, cudnn/frost/buffers.py CUTEDSL_MIN_VERSION
FROST_SMS = (100, 101, 102, 103, 107)  # frost/engine.py: 100 <= sm <= 103 or sm == 107
HOPPER_SM = 90
CUTILE_MIN_CUDART = (13, 3)  # la/cutile/engine.py CUTILE_MIN_CUDART = 13030
CUDA_TILE_DIST = "cuda-tile"
CUDA_TILE_FLOOR = (1, 4)  # FE's `cutile` extra pins cuda-tile>=1.4
TILEIRAS_DIST = "nvidia-cuda-tileiras"
FLA_DISTS = ("fla-core", "flash-linear-attention")
FLA_FLOOR = (0, 6)  # the FLA adapter targets the 0.6 API (chunk_gdn2, state_v_first)
FLA_HOPPER_BAD_TRITON = ((3, 4, 0), (3, 7, 1))  # fla/ops/common/chunk_o.py:727, FLA issue #640

FLOORS: dict[str, Any] = {
    "nvidia-cudnn-frontend (gdn, gdn2: NaN below)": FE_NAN_FLOOR,
    "nvidia-cudnn-frontend (gdn2 steep-decay fix; below = KNOWN-WRONG note)": FE_GDN2_STEEP_FIX,
    "nvidia-cudnn-frontend (kda Hopper engines)": FE_HOPPER_KDA,
    "nvidia-cutlass-dsl (FROST)": CUTLASS_DSL_FLOOR,
    "FROST SMs": FROST_SMS,
    "CUDA runtime (cuTile)": CUTILE_MIN_CUDART,
    "cuda-tile (cuTile)": CUDA_TILE_FLOOR,
    "fla-core": FLA_FLOOR,
    "triton range refused by FLA GDN backward on Hopper [lo, hi)": FLA_HOPPER_BAD_TRITON,
}

# Where each op lives. The cuDNN names are lazy exports of cudnn.linear_attention (la/__init__.py).
ENTRY_POINTS: dict[tuple[str, str], tuple[str, str]] = {
    ("cudnn", "gdn"): ("cudnn.linear_attention", "gated_delta_net"),
    ("cudnn", "kda"): ("cudnn.linear_attention", "kimi_delta_attention"),
    ("cudnn", "gdn2"): ("cudnn.linear_attention", "gated_delta_net_v2"),
    ("fla", "gdn"): ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    ("fla", "kda"): ("fla.ops.kda", "chunk_kda"),
    ("fla", "gdn2"): ("fla.ops.gdn2", "chunk_gdn2"),
    ("fla-recurrent", "gdn"): ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),
    ("fla-recurrent", "kda"): ("fla.ops.kda", "fused_recurrent_kda"),
    ("fla-recurrent", "gdn2"): ("fla.ops.gdn2", "fused_recurrent_gdn2"),
}
_FLA_INSTALL = "pip install -U 'fla-core>=0.6'"
_INSTALL = {"cudnn": FE_INSTALL, "fla": _FLA_INSTALL, "fla-recurrent": _FLA_INSTALL}
_DIST_OF = {"cudnn": FE_DIST, "fla": "fla-core", "fla-recurrent": "fla-core"}
_VERSION_OF = {"cudnn": "cudnn_frontend", "fla": "fla", "fla-recurrent": "fla"}

# Keys of Env.versions (a missing package is None, never absent, so reports show the gap).
VERSION_KEYS = (
    "torch",
    "cuda_runtime",  # torch.version.cuda: the CUDA torch was built with
    "cudart",  # cuda.bindings' cudaRuntimeGetVersion: what the cuTile engines check
    "driver",  # nvidia-smi / pynvml
    "torch_cudnn",
    "cudnn_frontend",
    "cudnn_backend",
    "cutlass_dsl",
    "cuda_tile",
    "tileiras",  # from `tileiras --version`; None when absent or not runnable
    "tileiras_dist",
    "fla",
    "triton",
    "transformer_engine",
)
_DIST_KEYS = {
    "cudnn_frontend": (FE_DIST,),
    "cutlass_dsl": (CUTLASS_DSL_DIST, "nvidia-cutlass-dsl-internal"),
    "cuda_tile": (CUDA_TILE_DIST,),
    "tileiras_dist": (TILEIRAS_DIST,),
    "fla": FLA_DISTS,
    "triton": ("triton",),
    "transformer_engine": ("transformer-engine", "transformer_engine", "transformer-engine-torch"),
}
# Modules whose presence matters, checked with find_spec (resolved, not executed: cheap, no side effects).
IMPORTABLE_KEYS = ("cudnn", "cutlass", "cuda.tile", "cuda.bindings", "fla", "triton", "transformer_engine")


# --------------------------------------------------------------------------------------------------
# Environment


@dataclass(frozen=True)
class Env:
    """A snapshot of the machine. Build it with ``probe_env()``, or directly (tests)."""

    cuda: bool
    device_name: str | None = None
    capability: tuple[int, int] | None = None
    versions: Mapping[str, str | None] = field(default_factory=dict)
    python: str = platform.python_version()
    host: str = platform.node()
    importable: Mapping[str, bool] = field(default_factory=dict)  # find_spec found the module
    tools: Mapping[str, str | None] = field(default_factory=dict)  # e.g. tileiras -> its path
    probe_errors: Mapping[str, str] = field(default_factory=dict)  # what the probe could not read

    @property
    def sm(self) -> int | None:
        return None if self.capability is None else self.capability[0] * 10 + self.capability[1]

    def version(self, key: str) -> str | None:
        return self.versions.get(key)

    def device(self) -> str:
        """``SM90 (NVIDIA H200)``, or ``no CUDA device``."""
        if not self.cuda:
            return "no CUDA device"
        sm = f"SM{self.sm}" if self.sm is not None else "SM?"
        return f"{sm} ({self.device_name})" if self.device_name else sm

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("versions", "importable", "tools", "probe_errors"):
            d[key] = dict(getattr(self, key))
        d["capability"] = list(self.capability) if self.capability is not None else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Env:
        """Inverse of ``to_dict``; unknown keys are ignored (records written by newer versions)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if kw.get("capability") is not None:
            kw["capability"] = tuple(int(x) for x in kw["capability"])
        return cls(**kw)


class Finder:
    """Where ``probe_env`` looks: raw queries only, so a fake can stand in for any of them.

    Every method returns None (or False) when the thing is absent and never raises; the real
    implementation catches everything, because a probe must not be the thing that crashes a run.
    """

    def dist_version(self, dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except Exception:  # noqa: BLE001
            return None

    def has_module(self, name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except Exception:  # noqa: BLE001 - a parent that fails to import counts as absent
            return False

    def module_dirs(self, name: str) -> list[str]:
        """The directories of a (namespace) package, without importing it."""
        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # noqa: BLE001
            return []
        return list(spec.submodule_search_locations or []) if spec else []

    def which(self, tool: str, path: str | None = None) -> str | None:
        return shutil.which(tool, path=path)

    def getenv(self, name: str) -> str | None:
        return os.environ.get(name)

    def run(self, argv: Sequence[str], timeout: float = 15.0) -> str | None:
        """stdout of a successful command, else None."""
        try:
            res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        except Exception:  # noqa: BLE001
            return None
        return res.stdout if res.returncode == 0 else None

    def torch_facts(self) -> dict:
        import torch

        facts: dict[str, Any] = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "cuda": False}
        try:
            facts["torch_cudnn"] = _str_or_none(torch.backends.cudnn.version())
        except Exception:  # noqa: BLE001
            facts["torch_cudnn"] = None
        try:
            if torch.cuda.is_available():
                facts["cuda"] = True
                facts["device_name"] = torch.cuda.get_device_name(0)
                facts["capability"] = tuple(torch.cuda.get_device_capability(0))
        except Exception as exc:  # noqa: BLE001
            facts["cuda"] = False
            facts["error"] = f"{type(exc).__name__}: {exc}"
        return facts

    def cudart_version(self) -> str | None:
        if not self.has_module("cuda.bindings"):
            return None
        try:
            from cuda.bindings import runtime  # type: ignore[import-not-found]

            err, v = runtime.cudaRuntimeGetVersion()
            return f"{v // 1000}.{(v % 1000) // 10}" if int(err) == 0 else None
        except Exception:  # noqa: BLE001
            return None

    def driver_version(self) -> str | None:
        nvml = self._nvml_driver()
        if nvml:
            return nvml
        smi = self.which("nvidia-smi")
        out = self.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"]) if smi else None
        return out.strip().splitlines()[0].strip() if out and out.strip() else None

    def _nvml_driver(self) -> str | None:
        if not self.has_module("pynvml"):
            return None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        except Exception:  # noqa: BLE001
            return None

    def cudnn_backend_version(self) -> str | None:
        """Imports ``cudnn`` (the frontend's C extension loads libcudnn); only called when the FE
        distribution is installed, and any failure is an absent version, not a crash."""
        try:
            import cudnn  # type: ignore[import-not-found]

            fn = getattr(cudnn, "backend_version_string", None)
            if callable(fn):
                return str(fn())
            v = int(cudnn.backend_version())
            return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}" if v >= 10000 else str(v)
        except BaseException:  # noqa: BLE001 - SystemExit from a broken extension included
            return None


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


_TILEIRAS_VERSION = re.compile(r"release (\d+\.\d+)|V(\d+\.\d+(?:\.\d+)?)")


def _find_tileiras(finder: Finder) -> str | None:
    """cuda.tile's own search order: the nvidia-cuda-tileiras wheel (nvidia/cu13/bin), cuda.tile's
    bundled _deps/bin, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin."""
    dirs = [os.path.join(d, "bin") for d in finder.module_dirs("nvidia.cu13")]
    dirs += [os.path.join(d, "_deps", "bin") for d in finder.module_dirs("cuda.tile")]
    for d in dirs:
        if hit := finder.which("tileiras", d):
            return hit
    if hit := finder.which("tileiras"):
        return hit
    cuda_home = finder.getenv("CUDA_HOME") or finder.getenv("CUDA_PATH")
    for d in ([os.path.join(cuda_home, "bin")] if cuda_home else []) + ["/usr/local/cuda/bin"]:
        if hit := finder.which("tileiras", d):
            return hit
    return None


def _probe(finder: Finder) -> Env:
    errors: dict[str, str] = {}
    try:
        tf = finder.torch_facts()
    except Exception as exc:  # noqa: BLE001
        tf = {"cuda": False}
        errors["torch"] = f"{type(exc).__name__}: {exc}"
    if tf.get("error"):
        errors["cuda"] = tf["error"]
    cuda = bool(tf.get("cuda"))

    versions: dict[str, str | None] = {k: None for k in VERSION_KEYS}
    versions["torch"] = tf.get("torch")
    versions["cuda_runtime"] = tf.get("cuda_runtime")
    versions["torch_cudnn"] = tf.get("torch_cudnn")
    for key, dists in _DIST_KEYS.items():
        versions[key] = next((v for v in map(finder.dist_version, dists) if v), None)
    versions["cudart"] = finder.cudart_version()
    versions["driver"] = finder.driver_version() if cuda else None
    if versions["cudnn_frontend"]:
        versions["cudnn_backend"] = finder.cudnn_backend_version()
        if versions["cudnn_backend"] is None:
            errors["cudnn_backend"] = "import cudnn failed or reported no backend version"

    tools: dict[str, str | None] = {"tileiras": _find_tileiras(finder)}
    if tools["tileiras"]:
        out = finder.run([tools["tileiras"], "--version"])
        if out is None:
            errors["tileiras"] = f"{tools['tileiras']} --version failed: found but not runnable"
        else:
            m = _TILEIRAS_VERSION.search(out)
            versions["tileiras"] = (m.group(1) or m.group(2)) if m else "unknown"

    importable = {name: finder.has_module(name) for name in IMPORTABLE_KEYS}
    return Env(
        cuda=cuda,
        device_name=tf.get("device_name") if cuda else None,
        capability=tuple(tf["capability"]) if cuda and tf.get("capability") else None,
        versions=versions,
        importable=importable,
        tools=tools,
        probe_errors=errors,
    )


@lru_cache(maxsize=1)
def _probe_real() -> Env:
    return _probe(Finder())


def probe_env(finder: Finder | None = None) -> Env:
    """The real machine (probed once per process, cached) or, with ``finder``, a fresh uncached probe."""
    return _probe_real() if finder is None else _probe(finder)


def visible_gpus(environ=os.environ, run=subprocess.run) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries, without initializing CUDA here
    (a process that has touched CUDA can no longer be pinned to one GPU, and its children inherit that).

    An explicit ``CUDA_VISIBLE_DEVICES`` is the answer (``""`` hides every GPU); otherwise
    ``nvidia-smi -L`` counts them. No nvidia-smi: no GPUs."""
    pinned = environ.get("CUDA_VISIBLE_DEVICES")
    if pinned is not None:
        return [d.strip() for d in pinned.split(",") if d.strip()]
    try:
        out = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i in range(sum(1 for line in out.splitlines() if line.startswith("GPU ")))]


# --------------------------------------------------------------------------------------------------
# Pair verdicts


def _vt(v: str | None) -> tuple[int, ...] | None:
    """Leading numeric release of a version string: '1.32.0' -> (1, 32, 0), '3.5.0+git' -> (3, 5, 0),
    '1.4.0rc1' -> (1, 4, 0); None when there is no leading number."""
    if not v:
        return None
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(v))
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _lt(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)) < b + (0,) * (n - len(b))


def _fmt(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def _no_cuda(env: Env) -> str:
    extra = f" ({env.probe_errors['cuda']})" if env.probe_errors.get("cuda") else ""
    return f"needs a CUDA GPU — torch.cuda.is_available() is False{extra}; run on a GPU runner"


def _frost_arch(env: Env) -> str:
    return (
        f"needs SM100/101/102/103/107 (Blackwell, FROST engines) — found {env.device()}; "
        "run on a B200/GB200/B300 runner"
    )


def _cutlass_dsl_unmet(env: Env) -> list[str]:
    """Mirrors FROST's own check: the module must resolve, and the public wheel must be >= 4.7.0
    (an internal build's numbering, or an unreadable version, is not judged)."""
    v = env.version("cutlass_dsl")
    fix = "pip install -U 'nvidia-cutlass-dsl>=4.7'"
    if not env.importable.get("cutlass", False):
        found = f" (the {v} distribution is installed but `cutlass` does not resolve)" if v else " is not installed"
        return [f"nvidia-cutlass-dsl{found}; FROST engines need it; {fix}"]
    vt = _vt(v)
    if vt is not None and _lt(vt, CUTLASS_DSL_FLOOR):
        return [f"nvidia-cutlass-dsl {v} < {_fmt(CUTLASS_DSL_FLOOR)} (FROST engines fail to compile); {fix}"]
    return []


def _cutile_unmet(env: Env) -> list[str]:
    unmet = []
    cudart = env.version("cudart") or env.version("cuda_runtime")
    src = "cuda-bindings" if env.version("cudart") else "torch.version.cuda"
    ct = _vt(cudart)
    if ct is None:
        unmet.append(
            "CUDA runtime version unknown (cuda-bindings absent); cuTile needs >= 13.3; "
            "pip install 'cuda-bindings>=13.3' (and a CUDA 13.3+ driver)"
        )
    elif _lt(ct, CUTILE_MIN_CUDART):
        unmet.append(
            f"CUDA runtime {cudart} ({src}) < {_fmt(CUTILE_MIN_CUDART)} (cuTile engines); "
            "use a CUDA 13.3+ runtime: pip install 'cuda-bindings>=13.3' with a 13.3+ driver"
        )
    tile = env.version("cuda_tile")
    if tile is None or not env.importable.get("cuda.tile", False):
        what = f"cuda-tile {tile} is installed but `cuda.tile` does not resolve" if tile else "cuda-tile is not installed"
        unmet.append(f"{what} (cuTile engines); pip install 'cuda-tile[tileiras]>=1.4'")
    elif (tt := _vt(tile)) is not None and _lt(tt, CUDA_TILE_FLOOR):
        unmet.append(f"cuda-tile {tile} < {_fmt(CUDA_TILE_FLOOR)} (cuTile engines); pip install -U 'cuda-tile>=1.4'")
    path = env.tools.get("tileiras")
    if not path:
        unmet.append(
            "tileiras not found (not in nvidia-cuda-tileiras, on PATH or in $CUDA_HOME/bin; cuTile compiles with it); "
            "pip install 'cuda-tile[tileiras]' or put a CUDA 13.3+ toolkit's bin/ on PATH"
        )
    elif env.version("tileiras") is None:
        unmet.append(f"tileiras at {path} does not run (`{path} --version` failed); reinstall nvidia-cuda-tileiras")
    return unmet


def _finish(pair: str, unmet: list[str], notes: list[str], *, backward_reason: str = "") -> Verdict:
    if unmet:
        if len(unmet) == 1:
            item = unmet[0]
            reason = f"{pair} {item}" if item.startswith("needs ") else f"{pair}: {item}"
        else:
            reason = f"{pair} cannot run: " + " ".join(f"({i}) {u}" for i, u in enumerate(unmet, 1))
        return Verdict(False, reason, False, reason, tuple(notes))
    if backward_reason:
        return Verdict.ok(*notes, backward=False, backward_reason=backward_reason)
    return Verdict.ok(*notes)


def _cudnn_verdict(op: str, env: Env) -> Verdict:
    pair = f"cudnn:{op}"
    unmet: list[str] = []
    notes: list[str] = []
    if not env.cuda:
        unmet.append(_no_cuda(env))
    fe = env.version("cudnn_frontend")
    fe_t = _vt(fe)
    if fe is None:
        unmet.append(f"{FE_DIST} is not installed; {FE_INSTALL}")
    elif fe_t is None:
        notes.append(f"{FE_DIST} version {fe!r} is unreadable; version floors were not checked")
    else:
        if op in ("gdn", "gdn2") and _lt(fe_t, FE_NAN_FLOOR):
            unmet.append(
                f"{FE_DIST} {fe} < {_fmt(FE_NAN_FLOOR)} ({op.upper()} kernels can return NaN); {FE_INSTALL}"
            )
        elif op == "gdn2" and _lt(fe_t, FE_GDN2_STEEP_FIX):
            notes.append(
                f"KNOWN-WRONG: {FE_DIST} {fe} < {_fmt(FE_GDN2_STEEP_FIX)}: GDN2 returns NaN under steep "
                f"per-channel decay (fixed in 1.32); measured, not trusted; {FE_INSTALL}"
            )

    # Engines: a pair runs when at least one engine family has everything it needs.
    sm = env.sm
    on_blackwell = env.cuda and sm in FROST_SMS
    if op == "gdn2":  # FROST only
        if env.cuda and not on_blackwell:
            unmet.append(_frost_arch(env))
        unmet += _cutlass_dsl_unmet(env)
        return _finish(pair, unmet, notes)

    paths: dict[str, list[str]] = {}
    if on_blackwell or not env.cuda:
        paths["FROST"] = _cutlass_dsl_unmet(env)
    paths["cuTile"] = _cutile_unmet(env)
    if op == "kda" and (sm == HOPPER_SM or not env.cuda):
        hop: list[str] = []
        if fe_t is not None and _lt(fe_t, FE_HOPPER_KDA):
            hop.append(f"{FE_DIST} {fe} < {_fmt(FE_HOPPER_KDA)} (no Hopper KDA engines before 1.30); {FE_INSTALL}")
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
    return _finish(pair, unmet, notes)


def _is_fla_hopper(env: Env) -> bool:
    # FLA's own test (fla/utils/hardware.py): 'NVIDIA H' in the name, or compute capability major 9.
    return env.cuda and (("NVIDIA H" in (env.device_name or "")) or (env.capability or (0, 0))[0] == 9)


def _fla_verdict(backend: str, op: str, env: Env) -> Verdict:
    pair = f"{backend}:{op}"
    unmet: list[str] = []
    notes: list[str] = []
    if not env.cuda:
        unmet.append(_no_cuda(env))
    fla = env.version("fla")
    if fla is None:
        unmet.append(f"fla-core is not installed; {_FLA_INSTALL}")
    elif (ft := _vt(fla)) is None:
        notes.append(f"fla-core version {fla!r} is unreadable; the 0.6 floor was not checked")
    elif _lt(ft, FLA_FLOOR):
        unmet.append(
            f"fla-core {fla} < {_fmt(FLA_FLOOR)} (the adapter targets the 0.6 API: chunk_gdn2, state_v_first); "
            f"{_FLA_INSTALL}"
        )
    triton = env.version("triton")
    if triton is None:
        unmet.append("triton is not installed (FLA compiles its kernels with Triton); pip install triton")
    backward_reason = ""
    if backend == "fla" and op == "gdn" and triton is not None and _is_fla_hopper(env):
        tt = _vt(triton)
        lo, hi = FLA_HOPPER_BAD_TRITON
        if tt is None:
            notes.append(f"triton version {triton!r} is unreadable; FLA's Hopper GDN-backward guard not evaluated")
        elif not _lt(tt, lo) and _lt(tt, hi):
            backward_reason = (
                f"FLA refuses the GDN backward on Hopper, {env.device()}, with triton {triton} "
                f"({_fmt(lo)} <= triton < {_fmt(hi)} gives wrong gradients, FLA #640); pip install -U 'triton>=3.7.1'"
            )
    return _finish(pair, unmet, notes, backward_reason=backward_reason)


def pair_verdict(backend: str, op: str, env: Env) -> Verdict:
    """Our floors and facts for ``backend:op`` on ``env``; the library's own planner still decides
    per case. Never imports a fused library."""
    if backend not in GATED_BACKENDS:
        return Verdict.ok()
    if op not in OPS:
        return Verdict.no(f"{backend}:{op}: unknown op {op!r}; deltacheck's ops are {', '.join(OPS)}")
    return _cudnn_verdict(op, env) if backend == "cudnn" else _fla_verdict(backend, op, env)


def merge_verdicts(*verdicts: Verdict) -> Verdict:
    """All must hold: reasons, backward reasons and notes are concatenated (duplicates dropped)."""

    def join(parts: Iterable[str]) -> str:
        return " | ".join(dict.fromkeys(p for p in parts if p))

    runnable = all(v.runnable for v in verdicts)
    reason = join(v.reason for v in verdicts if not v.runnable)
    backward = all(v.backward for v in verdicts)
    backward_reason = join(v.backward_reason for v in verdicts if not v.backward)
    notes = tuple(dict.fromkeys(n for v in verdicts for n in v.notes))
    return Verdict(runnable, reason, backward, backward_reason, notes)


def load_op(
    backend: str, op: str, importer: Callable[[str], Any] = importlib.import_module
) -> tuple[Any, Verdict]:
    """Import the library and fetch the op's entry point: ``(fn, Verdict.ok())`` or ``(None, decline)``.

    Covers "the backend raises on import" (any exception, including a broken shared library) and
    "the op attribute is missing" (an older library). ``importer`` is injectable: tests hand in a
    function that raises, or returns a fake module object without the attribute. Set
    ``FLA_DISABLE_BACKEND_DISPATCH=1`` before calling this for ``fla`` (FLA reads it once, at import).
    Pairs without a known entry point (third-party backends) return ``(None, Verdict.ok())``.
    """
    pair = f"{backend}:{op}"
    if (backend, op) not in ENTRY_POINTS:
        return None, Verdict.ok()
    mod_name, attr = ENTRY_POINTS[(backend, op)]
    install = _INSTALL[backend]
    try:
        mod = importer(mod_name)
    except ModuleNotFoundError as exc:
        top = mod_name.split(".")[0]
        if exc.name in (None, top):
            return None, Verdict.no(f"{pair}: cannot import {mod_name} ({exc}); {install}")
        if exc.name and mod_name.startswith(exc.name):
            return None, Verdict.no(
                f"{pair}: the installed {_DIST_OF[backend]} has no {exc.name} (too old for {op}); {install}"
            )
        return None, Verdict.no(
            f"{pair}: importing {mod_name} failed, it needs the missing module {exc.name!r}; "
            f"install it or reinstall: {install}"
        )
    except BaseException as exc:  # a library that raises on import is a decline, not a crash
        if isinstance(exc, KeyboardInterrupt):
            raise
        return None, Verdict.no(
            f"{pair}: importing {mod_name} raised {type(exc).__name__}: {str(exc).strip()[:300]}; "
            f"fix the installation (`python -c 'import {mod_name}'` shows the traceback) or {install}"
        )
    try:
        fn = getattr(mod, attr)
    except AttributeError:
        return None, Verdict.no(
            f"{pair}: {mod_name} has no {attr} (the installed {_DIST_OF[backend]} predates {op}); {install}"
        )
    except BaseException as exc:  # lazy exports import submodules inside getattr
        if isinstance(exc, KeyboardInterrupt):
            raise
        return None, Verdict.no(
            f"{pair}: loading {mod_name}.{attr} raised {type(exc).__name__}: {str(exc).strip()[:300]}; "
            f"fix the installation or {install}"
        )
    if not callable(fn):
        return None, Verdict.no(f"{pair}: {mod_name}.{attr} is not callable ({type(fn).__name__}); {install}")
    return fn, Verdict.ok()


def floors_then_library(backend: str, op: str, env: Env, library: Callable[[], Verdict]) -> Verdict:
    """What a fused adapter's ``check`` returns: our floors and facts first (no library import); only if they
    hold, ``library()`` — what the library itself says about the case — merged in."""
    verdict = pair_verdict(backend, op, env)
    return merge_verdicts(verdict, library()) if verdict.runnable else verdict


def check_pair(
    backend: str, op: str, env: Env, importer: Callable[[str], Any] | None = importlib.import_module
) -> Verdict:
    """``pair_verdict`` and then, unless ``importer`` is None or the package is not installed at all,
    ``load_op``: every unmet requirement in one verdict."""
    verdict = pair_verdict(backend, op, env)
    if importer is None or backend not in GATED_BACKENDS or op not in OPS:
        return verdict
    if env.version(_VERSION_OF[backend]) is None:
        return verdict  # "not installed" is already the reason; an import would only repeat it
    return merge_verdicts(verdict, load_op(backend, op, importer)[1])


def gate_verdicts(pairs: Iterable[tuple[str, str]], env: Env) -> dict[tuple[str, str], Verdict]:
    return {pair: pair_verdict(pair[0], pair[1], env) for pair in pairs}


# --------------------------------------------------------------------------------------------------
# Required mode


class RequiredModeError(Exception):
    """A required pair cannot be qualified. ``failures`` are the lines; ``str()`` is the report."""

    def __init__(self, failures: Sequence[str] | str) -> None:
        self.failures = [failures] if isinstance(failures, str) else list(failures)
        super().__init__(format_required_report(self.failures))


class RequireSpecError(RequiredModeError, ValueError):
    """``DELTACHECK_REQUIRE`` / ``NVTE_*_TEST_REQUIRED`` is malformed (a usage error: exit 2)."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}
_LEGACY = (("NVTE_GDN2_TEST_REQUIRED", ("cudnn", "gdn2")), ("NVTE_GDN_TEST_REQUIRED", ("cudnn", "gdn")))
_BACKEND_RE = re.compile(r"^[A-Za-z_][\w.-]*(:[A-Za-z_]\w*)?$")


def required_spec(
    environ: Mapping[str, str] | None = None, known_ops: Collection[str] = OPS
) -> dict[tuple[str, str], str]:
    """Required pairs, each with what required it (``{("cudnn", "gdn2"): "NVTE_GDN2_TEST_REQUIRED=1"}``).

    ``DELTACHECK_REQUIRE`` is a comma list of ``backend:op``; the op is after the *last* colon so a
    third-party ``pkg.mod:attr:gdn`` works. Every malformed entry is reported in one RequireSpecError.
    """
    environ = os.environ if environ is None else environ
    pairs: dict[tuple[str, str], str] = {}
    errors: list[str] = []
    for var, pair in _LEGACY:
        raw = environ.get(var, "")
        val = raw.strip().lower()
        if val in _TRUE:
            pairs.setdefault(pair, f"{var}={raw}")
        elif val not in _FALSE:
            errors.append(f"{var}={raw!r} is neither 1 nor 0; set {var}=1 to require {pair[0]}:{pair[1]}, or unset it")
    raw = environ.get("DELTACHECK_REQUIRE", "")
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        backend, sep, op = entry.rpartition(":")
        if not sep or not backend:
            errors.append(
                f"DELTACHECK_REQUIRE entry {entry!r} is not backend:op (e.g. cudnn:gdn2, fla:kda); "
                f"ops: {', '.join(known_ops)}"
            )
        elif op not in known_ops:
            errors.append(
                f"DELTACHECK_REQUIRE entry {entry!r}: unknown op {op!r}; known ops: {', '.join(known_ops)}"
            )
        elif not _BACKEND_RE.match(backend):
            errors.append(
                f"DELTACHECK_REQUIRE entry {entry!r}: {backend!r} is not a backend name or pkg.mod:attr"
            )
        else:
            pairs.setdefault((backend, op), f"DELTACHECK_REQUIRE={raw}")
    if errors:
        raise RequireSpecError([f"required-mode configuration error: {e}" for e in errors])
    return pairs


def required_pairs(
    environ: Mapping[str, str] | None = None, known_ops: Collection[str] = OPS
) -> set[tuple[str, str]]:
    return set(required_spec(environ, known_ops))


def _declines(value: Any) -> tuple[int, str]:
    """``declined[pair]`` may be a count, ``(count, first_reason)``, one reason, or the reasons in order."""
    if value is None:
        return 0, ""
    if isinstance(value, bool):
        return int(value), ""
    if isinstance(value, int):
        return value, ""
    if isinstance(value, str):
        return 1, value
    seq = list(value)
    if len(seq) == 2 and isinstance(seq[0], int) and not isinstance(seq[0], bool):
        return seq[0], str(seq[1] or "")
    return len(seq), (str(seq[0]) if seq else "")


def _strip_pair(reason: str, name: str) -> str:
    """``cudnn:gdn2 needs SM100…`` -> ``needs SM100…``: the failure line already names the pair."""
    for prefix in (f"{name} cannot run: ", f"{name}: ", f"{name} "):
        if reason.startswith(prefix):
            return reason[len(prefix):]
    return reason


def required_failures(
    required: Collection[tuple[str, str]] | Mapping[tuple[str, str], str],
    gate_verdicts: Mapping[tuple[str, str], Verdict],
    executed: Mapping[tuple[str, str], int],
    declined: Mapping[tuple[str, str], Any] | None = None,
    *,
    backward_selected: Collection[tuple[str, str]] | None = None,
    backward_runs: Mapping[tuple[str, str], tuple[int, int, str]] | None = None,
) -> list[str]:
    """One line per required pair that cannot be qualified (empty list: required mode holds).

    - ``gate_verdicts``: the pair's gate verdict (``check_pair`` / the adapter's); a missing entry
      means the pair was never part of this run.
    - ``executed``: cases of the pair that actually ran (any check); ``declined``: per pair, the
      cases its ``check()`` declined: a count, ``(count, first_reason)`` (what the runner and the
      pytest plugin pass), or the list of reasons.
    - ``backward_selected``: pairs whose selected cases include backward; None (unknown) means all
      required pairs, so a gate-level backward refusal is never silently passed over.
    - ``backward_runs``: per pair, ``(backward cases that ran forward, of them with gradients judged,
      first backward-decline reason)``; a required pair whose backward cases all had their backward
      declined case by case fails too (the pair-level verdict cannot see per-case declines).
    - ``required`` may be the ``required_spec`` mapping, so each line also says what required it.
    """
    declined = declined or {}
    sources = required if isinstance(required, Mapping) else {}
    failures: list[str] = []
    for pair in sorted(required):
        name = f"{pair[0]}:{pair[1]}"
        src = f" [required by {sources[pair]}]" if sources.get(pair) else ""
        verdict = gate_verdicts.get(pair)
        n_exec = int(executed.get(pair, 0) or 0)
        n_decl, first = _declines(declined.get(pair))
        if verdict is not None and not verdict.runnable:
            failures.append(f"REQUIRED {name} cannot run: {_strip_pair(verdict.reason, name)}{src}")
            continue
        if verdict is None and n_exec == 0 and n_decl == 0:
            failures.append(
                f"REQUIRED {name} was not part of this run (no gate verdict, zero cases); "
                f"select it with --backend {pair[0]} --op {pair[1]} (under pytest: --dc-backend {pair[0]}){src}"
            )
            continue
        if n_exec == 0:
            if n_decl:
                why = f"; first reason: {first}" if first else ""
                failures.append(
                    f"REQUIRED {name} executed zero cases: all {n_decl} selected case(s) were declined by the "
                    f"backend{why}; fix that cause or select cases it serves{src}"
                )
            else:
                failures.append(
                    f"REQUIRED {name} executed zero cases: none was declined — the selection (-k / --op / --tier) "
                    f"filtered every {name} case away; widen -k or add --op {pair[1]}{src}"
                )
            continue
        wants_bwd = backward_selected is None or pair in backward_selected
        if verdict is not None and not verdict.backward and wants_bwd:
            failures.append(f"REQUIRED {name} cannot run its backward: {_strip_pair(verdict.backward_reason, name)}{src}")
            continue
        n_bwd, n_bwd_ran, bwd_why = (backward_runs or {}).get(pair, (0, 0, ""))
        if n_bwd and not n_bwd_ran:
            why = f"; first reason: {bwd_why}" if bwd_why else ""
            failures.append(
                f"REQUIRED {name} ran no backward: all {n_bwd} backward case(s) had their gradients declined{why}; "
                f"fix that cause or select backward cases it serves{src}"
            )
    return failures


def format_required_report(failures: Sequence[str]) -> str:
    """The text the CLI and the pytest plugin both print; empty when there is nothing to report."""
    if not failures:
        return ""
    head = f"deltacheck REQUIRED MODE FAILED: {len(failures)} required pair(s) cannot be qualified"
    bar = "=" * len(head)
    return "\n".join([bar, head, *(f"  * {f}" for f in failures), bar])


# --------------------------------------------------------------------------------------------------
# `deltacheck env`

_PACKAGE_ROWS = (
    ("nvidia-cudnn-frontend", "cudnn_frontend", "cudnn"),
    ("  cuDNN backend", "cudnn_backend", None),
    ("nvidia-cutlass-dsl", "cutlass_dsl", "cutlass"),
    ("cuda-tile", "cuda_tile", "cuda.tile"),
    ("tileiras", "tileiras", None),
    ("  nvidia-cuda-tileiras", "tileiras_dist", None),
    ("fla-core", "fla", "fla"),
    ("triton", "triton", "triton"),
    ("transformer-engine", "transformer_engine", "transformer_engine"),
)


def _shown_pairs() -> list[tuple[str, str]]:
    return [(b, o) for b in GATED_BACKENDS for o in OPS]


def env_report(env: Env, environ: Mapping[str, str] | None = None, *, importer=None) -> dict:
    """What ``deltacheck env --json`` prints: the snapshot, every gated pair's verdict, required mode."""
    pairs = _shown_pairs()
    try:
        spec = required_spec(environ)
        spec_error = ""
    except RequireSpecError as exc:
        spec, spec_error = {}, "\n".join(exc.failures)
    for pair in spec:
        if pair not in pairs:
            pairs.append(pair)
    verdicts = {p: (check_pair(*p, env, importer) if importer else pair_verdict(*p, env)) for p in pairs}
    failing = [
        f"REQUIRED {b}:{o} cannot run: {_strip_pair(verdicts[(b, o)].reason, f'{b}:{o}')} [required by {src}]"
        for (b, o), src in sorted(spec.items())
        if not verdicts[(b, o)].runnable
    ]
    return {
        "env": env.to_dict(),
        "pairs": {f"{b}:{o}": asdict(v) | {"notes": list(v.notes)} for (b, o), v in verdicts.items()},
        "required": {f"{b}:{o}": src for (b, o), src in sorted(spec.items())},
        "required_error": spec_error,
        "required_failures": failing,
    }


def format_env(report: dict) -> str:
    env = Env.from_dict(report["env"])
    v = env.versions
    lines = ["deltacheck env", ""]
    lines.append(f"  device        {env.device()}")
    if env.cuda:
        lines.append(f"  driver        {v.get('driver') or '(unknown: no nvidia-smi/pynvml)'}")
    lines.append(
        f"  CUDA runtime  torch built with {v.get('cuda_runtime') or 'none (CPU build)'}; "
        f"cudart (cuda-bindings) {v.get('cudart') or 'absent'}"
    )
    lines.append(f"  python/torch  {env.python} / {v.get('torch')}   (torch's cuDNN {v.get('torch_cudnn') or '-'})")
    lines.append(f"  host          {env.host}")
    lines += ["", "packages"]
    for label, key, mod in _PACKAGE_ROWS:
        ver = v.get(key) or "-"
        extra = ""
        if mod is not None and v.get(key):
            extra = "importable" if env.importable.get(mod) else "NOT importable"
        if key == "tileiras" and env.tools.get("tileiras"):
            extra = env.tools["tileiras"] + ("" if v.get("tileiras") else "  (does not run)")
        lines.append(f"  {label:<24}{ver:<12}{extra}".rstrip())
    for k, msg in env.probe_errors.items():
        lines.append(f"  ! probe {k}: {msg}")
    lines += ["", "pairs (our floors; each library still decides per case)"]
    for name, d in report["pairs"].items():
        if d["runnable"]:
            status = "ok" if d["backward"] else "ok (forward only)"
            lines.append(f"  {name:<12}{status}")
            if not d["backward"]:
                lines.append(f"      backward: {d['backward_reason']}")
        else:
            lines.append(f"  {name:<12}skip  {d['reason']}")
        for note in d["notes"]:
            lines.append(f"      note: {note}")
    lines.append("")
    if report["required_error"]:
        lines.append(report["required_error"])
    elif report["required"]:
        lines.append("required: " + ", ".join(f"{p} ({s})" for p, s in report["required"].items()))
    else:
        lines.append("required: none (NVTE_GDN2_TEST_REQUIRED=1, NVTE_GDN_TEST_REQUIRED=1, DELTACHECK_REQUIRE=backend:op,...)")
    if report["required_failures"]:
        lines += ["", format_required_report(report["required_failures"])]
    return "\n".join(lines)


def _cmd_env(args) -> int:
    env = probe_env()
    report = env_report(env, importer=importlib.import_module if args.imports else None)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(format_env(report))
    if report["required_error"]:
        return 2
    return 1 if report["required_failures"] else 0


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "env",
        help="show this machine (GPU, runtimes, libraries) and which backend:op pairs can run",
        description=(
            "Probe the machine and print, for every cudnn/fla/fla-recurrent × op pair, whether our floors let it run "
            "and why not. Exit status: 0; 1 if a required pair (NVTE_GDN2_TEST_REQUIRED, "
            "NVTE_GDN_TEST_REQUIRED, DELTACHECK_REQUIRE) cannot run here; 2 if the required-mode "
            "settings are malformed."
        ),
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--import",
        dest="imports",
        action="store_true",
        help="also import each installed library and look up the op entry points",
    )
    p.set_defaults(func=_cmd_env)

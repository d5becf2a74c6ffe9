"""``deltacheck env``: what this machine has, and which fused backend x op pairs our floors let run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict

from deltacheck.cases.support import OPS
from deltacheck.harness.backends.base import Verdict, backend_for, registered
from deltacheck.harness.ci.required import RequireSpecError, format_required_report, required_spec, strip_pair
from deltacheck.harness.machine.availability import library_verdict, load_backend, pair_availability
from deltacheck.harness.machine.environment import Env, probe_env

_PACKAGE_ROWS = (
    ("nvidia-cudnn-frontend", "cudnn_frontend", "cudnn"),
    ("  cuDNN backend", "cudnn_backend", None),
    ("nvidia-cutlass-dsl", "cutlass_dsl", "cutlass"),
    ("cuda-tile", "cuda_tile", "cuda.tile"),
    ("tileiras", "tileiras", None),
    ("  nvidia-cuda-tileiras", "tileiras_dist", None),
    ("  ptxas", "ptxas", None),
    ("  libnvvm", "libnvvm", None),
    ("fla-core", "fla", "fla"),
    ("triton", "triton", "triton"),
    ("transformer-engine", "transformer_engine", "transformer_engine"),
    ("vllm", "vllm", "vllm"),
    ("tokenspeed-flashkda", "flashkda", "flash_kda"),
    ("jax", "jax", "jax"),
    ("jax-linear-attention", "jax_linear_attention", "jla"),
    ("flashinfer-python", "flashinfer", "flashinfer"),
    ("flash-qla", "flash_qla", "flash_qla"),
    ("tilelang", "tilelang", "tilelang"),
    ("  apache-tvm-ffi", "tvm_ffi", None),
    ("  z3-solver", "z3", None),
)


def fused_backends() -> list[str]:
    """The registered backends that have floors of their own (the fused adapters), in registry order."""
    return [name for name in registered() if callable(getattr(backend_for(name), "pair_verdict", None))]


def _env_verdict(spec: str, op: str, env: Env, imports: bool) -> Verdict:
    """Our floors; with ``imports``, also the library's import and entry point."""
    backend, load_error = load_backend(spec)
    if backend is None:
        return Verdict.no(load_error)
    return library_verdict(backend, spec, op, env) if imports else pair_availability(backend, spec, op, env)


def env_report(env: Env, environ: Mapping[str, str] | None = None, *, imports: bool = False) -> dict:
    """What ``deltacheck env --json`` prints: the snapshot, every fused pair's verdict, required mode."""
    # Each fused backend with the ops it implements (te has no kda, fla no gdp); a required pair outside that
    # is still added below and reported.
    pairs = [(b, o) for b in fused_backends() for o in OPS if o in backend_for(b).ops]
    try:
        spec = required_spec(environ)
        spec_error = ""
    except RequireSpecError as exc:
        spec, spec_error = {}, "\n".join(exc.failures)
    for pair in spec:
        if pair not in pairs:
            pairs.append(pair)
    verdicts = {p: _env_verdict(*p, env, imports) for p in pairs}
    failing = [
        f"REQUIRED {b}:{o} cannot run: {strip_pair(verdicts[(b, o)].reason, f'{b}:{o}')} [required by {src}]"
        for (b, o), src in sorted(spec.items())
        if not verdicts[(b, o)].runnable
    ]
    from deltacheck.harness.run.pool import torch_threads

    threads, how = torch_threads(1, environ=environ)
    return {
        "env": env.to_dict(),
        "threads": {"per_process": threads, "how": how},
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
            how = env.tools.get("tileiras_via")
            extra = env.tools["tileiras"] + ("" if v.get("tileiras") else "  (does not run)") + (
                f"  (found via {how})" if how else "")
        if key in ("ptxas", "libnvvm"):
            if not env.tools.get("tileiras") or key not in env.tools:
                continue  # no tileiras, or an Env from before the toolchain probe
            extra = f"{env.tools[key]}  (what tileiras uses)" if env.tools.get(key) else "(absent where tileiras looks)"
        lines.append(f"  {label:<24}{ver:<12}{extra}".rstrip())
        if key == "libnvvm" and env.tools.get("cuda_home"):
            lines.append(f"  {'  CUDA_HOME':<24}{env.tools['cuda_home']}  (passed to tileiras: it takes ptxas and libnvvm "
                         "from there)")
    if "nvrtc_include" in env.tools:  # FE's NVRTC engines (kda_hopper_cuda) compile against it
        inc, missing = env.tools.get("nvrtc_include"), env.tools.get("nvrtc_include_missing")
        lines.append(f"  {'NVRTC include tree':<24}{inc or '(none with cuda_bf16.h)'}"
                     + (f"  (lacks {missing})" if missing else ""))
    for k, msg in env.probe_errors.items():
        lines.append(f"  ! probe {k}: {msg}")
    lines += ["", "pairs (our floors; each library still decides per case)"]
    width = max((len(name) for name in report["pairs"]), default=10) + 2
    for name, d in report["pairs"].items():
        if d["runnable"]:
            status = "ok" if d["backward"] else "ok (forward only)"
            lines.append(f"  {name:<{width}}{status}")
            if not d["backward"]:
                lines.append(f"      backward: {d['backward_reason']}")
        else:
            lines.append(f"  {name:<{width}}skip  {d['reason']}")
        for note in d["notes"]:
            lines.append(f"      note: {note}")
    if "threads" in report:
        t = report["threads"]
        lines.append(f"torch threads: {t['per_process']} per process for a one-process run ({t['how']}); "
                     "-j N divides the share")
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
    report = env_report(env, imports=args.imports)
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
            "Probe the machine and print, for every fused backend (cudnn, fla, fla-recurrent, te, te-checkpoint, vllm-fla, "
            "vllm-fla-recurrent, flashkda, flashkda-tokenspeed) × "
            "op it implements, whether our floors let it run "
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

"""The built-in backends, one declarative entry each: every list of backend names in deltacheck is derived from here
(the registry's imports, the run/verify/pytest defaults, the generated tiers' targets, the pytest markers, the
benchmark lanes, the names the help texts list). Imports nothing: reading the table costs nothing and needs no
library.

Adding a backend is this one entry plus its adapter package ``harness/backends/<package>/`` (its ``__init__``
registers the names with ``base.register``; docs/backends.md, "Adding a built-in backend").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuiltinBackend:
    """One built-in adapter package.

    - ``package``: the subpackage of ``harness/backends`` whose import registers ``names``;
    - ``names``: the registered names (a name ending in ``@*`` stands for a family the package registers, e.g.
      ``cudnn@<engine>``: shown in help texts, never run by default);
    - ``distribution``: the PyPI distribution of the library it calls (None: deltacheck's own code);
    - ``version_key``: the ``Env.versions`` key of that distribution;
    - ``floors``: where its floors live (``module:function``, a facts module's ``floors(backend, op, env)``: what
      the adapter's ``pair_verdict(op, env)`` hook returns for its own name);
    - ``envelopes``: whether it declares envelopes (``envelopes(op, env=, sm=)``);
    - ``tier_targets``: the architectures the generated tiers cover its envelopes for (None: any GPU);
    - ``fused``: part of the default fused set of ``run`` / ``verify`` / the pytest plugin (the first name);
    - ``optional``: the package may be absent from a trimmed install (its import is skipped, not an error);
    - ``lanes``: the names the fused lane benchmark runs by default (bench/lanes.py).
    """

    package: str
    names: tuple[str, ...]
    distribution: str | None = None
    version_key: str | None = None
    floors: str | None = None
    envelopes: bool = False
    tier_targets: tuple[int | None, ...] = ()
    fused: bool = False
    optional: bool = True
    lanes: tuple[str, ...] = ()

    @property
    def markers(self) -> tuple[str, ...]:
        """The pytest markers of its concrete names (``backend_<name>``)."""
        return tuple(marker(n) for n in self.names if not n.endswith("@*"))


BUILTINS: tuple[BuiltinBackend, ...] = (
    BuiltinBackend("reference", ("oracle", "chunked", "baseline"), optional=False),
    BuiltinBackend("cudnn", ("cudnn", "cudnn@*"), distribution="nvidia-cudnn-frontend", version_key="cudnn_frontend",
                   floors="deltacheck.harness.backends.cudnn.facts:floors", envelopes=True,
                   tier_targets=(90, 100), fused=True, lanes=("cudnn",)),
    BuiltinBackend("fla", ("fla", "fla-recurrent", "fla-dispatch", "fla-dispatch-cp"), distribution="fla-core", version_key="fla",
                   floors="deltacheck.harness.backends.fla.facts:floors", envelopes=True, tier_targets=(None,),
                   fused=True, lanes=("fla",)),
    BuiltinBackend("te", ("te", "te-checkpoint"), distribution="transformer-engine", version_key="transformer_engine",
                   floors="deltacheck.harness.backends.te.facts:floors"),  # TeBackend declares no envelopes()
    BuiltinBackend("vllm_fla", ("vllm-fla", "vllm-fla-recurrent"), distribution="vllm", version_key="vllm",
                   floors="deltacheck.harness.backends.vllm_fla.facts:floors", envelopes=True,
                   tier_targets=(None,)),
    BuiltinBackend("flashkda", ("flashkda", "flashkda-tokenspeed"), distribution="tokenspeed-flashkda",
                   version_key="flashkda", floors="deltacheck.harness.backends.flashkda.facts:floors",
                   envelopes=True, tier_targets=(90,)),
    BuiltinBackend("flashqla", ("flashqla",), distribution="flash-qla", version_key="flash_qla",
                   floors="deltacheck.harness.backends.flashqla.facts:floors", envelopes=True,
                   tier_targets=(90,)),
    BuiltinBackend("jaxla", ("jax",), distribution="jax-linear-attention", version_key="jax_linear_attention",
                   floors="deltacheck.harness.backends.jaxla.facts:floors", envelopes=True),
    BuiltinBackend("flashinfer", ("flashinfer", "flashinfer-decode"), distribution="flashinfer-python",
                   version_key="flashinfer", floors="deltacheck.harness.backends.flashinfer.facts:floors",
                   envelopes=True),
)


def marker(name: str) -> str:
    """A backend name as a pytest marker: ``cudnn@gdn_cutile`` -> ``backend_cudnn_gdn_cutile``."""
    return "backend_" + name.replace("-", "_").replace("@", "_")


def packages(*, optional: bool | None = None) -> list[str]:
    """The adapter packages, the reference first (``optional``: only those that may be absent, or only not)."""
    return [b.package for b in BUILTINS if optional is None or b.optional == optional]


FUSED_DEFAULT: tuple[str, ...] = tuple(b.names[0] for b in BUILTINS if b.fused)
TIER_TARGETS: tuple[tuple[str, int | None], ...] = tuple((b.names[0], sm) for b in BUILTINS for sm in b.tier_targets)
# Built-ins that declare envelopes but no tier targets (jax-linear-attention, FlashInfer): a run that names one
# gets the cases inside its envelopes appended to the tier, as a plug-in does, so `run --tier L0 --backend jax`
# judges what jax serves while L0 for everyone else (and its size in CI) stays as it is.
TIER_ON_DEMAND: tuple[str, ...] = tuple(n for b in BUILTINS if b.envelopes and not b.tier_targets for n in b.names)
LANES_DEFAULT: tuple[str, ...] = tuple(n for b in BUILTINS for n in b.lanes)


# Backends that need one process-wide library setting each way: a process holds only one side, so a run (or one
# worker of it) must not mix them. FLA reads FLA_DISABLE_BACKEND_DISPATCH once, when fla is first imported
# (fla/backends.py:27): `fla` / `fla-recurrent` import it with dispatch off, `fla-dispatch` / `fla-dispatch-cp` need
# it on. A worker of a run naming both sides would judge whichever came second the wrong way (fla-dispatch declines
# every case; fla runs other packages' kernels), and which came first depends on -j and the queue's order.
PROCESS_EXCLUSIVE: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    ("FLA reads FLA_DISABLE_BACKEND_DISPATCH once per process, when fla is first imported (fla/backends.py:27): "
     "'fla' and 'fla-recurrent' import it with dispatch off, 'fla-dispatch' and 'fla-dispatch-cp' need it on",
     (("fla", "fla-recurrent"), ("fla-dispatch", "fla-dispatch-cp"))),
)


def process_conflict(specs) -> str | None:
    """Why ``specs`` (the backends of one run, or of one process) cannot share a process, with what to do instead;
    None when they can. Only the named backends count: a plug-in (``pkg.mod:attr``) is never in a group."""
    named = list(dict.fromkeys(specs))
    for why, sides in PROCESS_EXCLUSIVE:
        found = [[s for s in named if s in side] for side in sides]
        if sum(bool(f) for f in found) < 2:
            continue
        first, second = [f for f in found if f][:2]
        a, b = " ".join(f"--backend {s}" for s in first), " ".join(f"--backend {s}" for s in second)
        return (f"{' and '.join(first)} cannot run beside {' and '.join(second)} in one run: {why}, so a worker "
                "that ran one side first would judge the other with dispatch the wrong way, and which side a "
                "worker meets first depends on -j and the queue. Run them as two runs of the same selection and "
                f"fold them with merge: `deltacheck run ... {a} --out runs/a`, `deltacheck run ... {b} --out "
                "runs/b`, then `deltacheck merge runs/a/<RUN> runs/b/<RUN> --out runs/both` (docs/ci.md)")
    return None


def help_names() -> str:
    """Every built-in name for a ``--backend`` help text (``cudnn@<engine>`` for a family)."""
    names = [n.replace("@*", "@<engine>") for b in BUILTINS[1:] + BUILTINS[:1] for n in b.names]
    return ", ".join(names)

"""TransformerEngine facts: the distribution, the modules, the version floor, what the modules can express, and
the cuDNN frontend requirements underneath — from the ``Env`` alone, without importing TransformerEngine. The
adapter (``adapter.py``) asks these first, then the library.

Sources (the TE 2.20.2 wheel, ``transformer_engine/pytorch/attention/linear_attention/``; docs/libraries.md keeps
the details): ``base.py`` (the shared checks, the THD conversion, the state contract, the CUDA requirement at
construction), ``gdn.py``, ``gdn2.py``, ``gdp.py`` (each module's flags, gate checks and head-size checks). The
modules are thin: each calls a cuDNN frontend op (``cudnn.linear_attention.ops``), so the cuDNN engines' needs
(SM, runtimes) are TE's needs too.
"""

from __future__ import annotations

from deltacheck.harness.machine.environment import Env
from deltacheck.plugin import gathered, no_cuda_reason, package_floor, strip_pair

from ..base import Verdict
from ..cudnn import facts as cudnn_facts

DIST = "transformer-engine"
INSTALL = "pip install --no-build-isolation 'transformer_engine[pytorch]>=2.20'"
INSTALL_HINT = f"transformer-engine is not installed ({INSTALL})"
FLOOR = "2.20"  # the linear-attention modules (transformer_engine.pytorch.attention.linear_attention) ship from 2.20

# op -> the module class, exported by transformer_engine.pytorch (TE 2.20 has no KDA module).
MODULE = "transformer_engine.pytorch"
ENTRY_POINTS = {
    "gdn": "GatedDeltaNetAttention",
    "gdn2": "GatedDeltaNet2Attention",
    "gdp": "GatedDeltaProductAttention",
}

# Head sizes each module's constructor accepts (gdn2.py / gdp.py ``supported_head_dims``: FROST's); GDN has no check.
HEAD_DIMS = {"gdn2": (64, 128), "gdp": (64, 128)}

# The flags each module's forward takes beyond use_qk_l2norm_in_kernel (the Case's names). Whatever else a
# case turns on, the module cannot express: GDN has no beta sigmoid, neg-eig, safe gate or gate domain; GDN2
# adds the sigmoid, neg-eig and beta_guard but exposes no safe gate or gate domain; GDP has the sigmoid,
# neg-eig, the softplus safe gate (a_log, dt_bias) and the linear gate domain, but no beta_guard.
FLAGS = {
    "gdn": frozenset({"l2norm", "scale"}),
    "gdn2": frozenset({"l2norm", "scale", "beta_sigmoid", "neg_eigval", "beta_guard"}),
    "gdp": frozenset({"l2norm", "scale", "beta_sigmoid", "neg_eigval", "linear_gate", "safe_gate", "a_log",
                      "dt_bias"}),
}

# qkv_format per case layout. TE has no bhsd: a framework holding bhsd tensors passes x.transpose(1, 2) as bshd.
QKV_FORMAT = {"thd": "thd", "bshd": "bshd", "sbhd": "sbhd", "bhsd": "bshd"}

FLOORS = {DIST: FLOOR, "cuDNN frontend op underneath": "as the cudnn backend (docs/libraries.md)"}


def floors(backend: str, op: str, env: Env) -> Verdict:
    """Our floors for ``te:op`` / ``te-checkpoint:op`` on ``env``: CUDA, TE >= 2.20, and on a GPU machine
    everything the cuDNN frontend op under the module needs (its engines' SMs and runtimes)."""
    pair = f"{backend}:{op}"
    unmet: list[str] = []
    notes: list[str] = []
    if not env.cuda:
        unmet.append(no_cuda_reason(env))
    package_floor(env.version("transformer_engine"), DIST, FLOOR, "no linear-attention modules before 2.20", INSTALL,
                  unmet, notes)
    if env.cuda:
        under = cudnn_facts.floors("cudnn", op, env)
        if not under.runnable:
            unmet.append(f"the cuDNN frontend op under {ENTRY_POINTS[op]} ({cudnn_facts.ENTRY_POINTS[op]}) cannot "
                         f"run here: {strip_pair(under.reason, f'cudnn:{op}')}")
        notes += list(under.notes)
    elif env.version("cudnn_frontend") is None:
        unmet.append(f"{cudnn_facts.DIST} is not installed (TE's modules call its ops); {cudnn_facts.INSTALL}")
    return gathered(pair, unmet, notes)

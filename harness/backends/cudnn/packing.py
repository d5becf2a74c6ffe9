"""What the cuDNN adapter hands ``cudnn.linear_attention`` and takes back, as tensors and keywords: the case's layout
packed to THD (cuDNN's only one) and back, the value-major state in and key-major out, every optional tensor in a
dtype the op accepts (FE 1.32's ``check_dtype`` rules; each cast said in a note), and every Case flag as its
keyword. ``adapter.py`` calls these (steps 1-4 of its docstring)."""

from __future__ import annotations

import torch

from deltacheck.harness.judge.margins import with_margin

from .facts import FP32_STATE_ENGINES

_F32, _BF16, _F16 = torch.float32, torch.bfloat16, torch.float16


def accepted_dtypes(op: str, name: str, io: torch.dtype, engine: str | None = None) -> tuple[torch.dtype, ...]:
    """The dtypes FE 1.32 accepts for one argument (ops/{gdn,kda,gdn2,gdp}.py ``check_dtype`` calls); with
    ``engine`` (a pinned one), what that engine takes where it takes less (facts.FP32_STATE_ENGINES).

    q/k/v are not listed: their dtype *is* the case (an fp32-io case is for the engines to decline).
    """
    if name == "initial_state" and engine in FP32_STATE_ENGINES:
        return (_F32,)
    if name in ("g", "a_log", "dt_bias", "initial_state"):
        return (_F32, _BF16, _F16)
    if name == "beta":
        return (io,) if op == "gdn2" else (_F32, io)
    if name == "w":
        return (io,)
    raise KeyError(name)


def to_thd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Case layout -> packed ``[N*L, heads, *feat]``: move to bshd, then flatten batch and sequence; contiguous
    between NaN margins (a transposed layout is copied into a margin-bearing buffer, harness/judge/margins.py)."""
    if layout == "thd":
        return with_margin(x)
    if layout == "sbhd":
        x = x.transpose(0, 1)
    elif layout == "bhsd":
        x = x.transpose(1, 2)
    x = with_margin(x)  # contiguous bshd: the flattening below is a view of the same buffer
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def from_thd(o: torch.Tensor, layout: str, n_seqs: int) -> torch.Tensor:
    """Packed ``[N*L, HO, V]`` -> the case's layout (inverse of ``to_thd``)."""
    if layout == "thd":
        return o
    o = o.reshape(n_seqs, o.shape[0] // n_seqs, *o.shape[1:])  # bshd
    if layout == "sbhd":
        return o.transpose(0, 1)
    if layout == "bhsd":
        return o.transpose(1, 2)
    return o


def state_to_cudnn(state: torch.Tensor | None) -> torch.Tensor | None:
    """make_inputs already gives cuDNN's value-major ``[N, HO, V, K]``; only contiguity is ensured."""
    return with_margin(state)


def state_from_cudnn(state: torch.Tensor) -> torch.Tensor:
    """cuDNN ``[N, HO, V, K]`` -> key-major ``[N, HO, K, V]``; bf16/fp16 states widen to fp32 (exact)."""
    state = state.transpose(-1, -2)
    return state.float() if state.dtype in (_BF16, _F16) else state


def op_keywords(case) -> dict:
    """Every Case flag as the op's keyword argument."""
    kwargs = {
        "scale": case.scale,  # None -> the op's own default 1/sqrt(K), the same as ours
        "output_final_state": True,
        "use_qk_l2norm_in_kernel": case.l2norm,
        "use_beta_sigmoid_in_kernel": case.beta_sigmoid,
        "allow_neg_eigval": case.neg_eigval,
        "gate_domain": case.gate_domain,
        "safe_gate": case.safe_gate,
    }
    if case.safe_gate and case.op in ("kda", "gdn2"):
        # The sigmoid safe gate's lower bound: the op's default (-5) today, passed explicitly so a
        # changed default cannot silently change what we test. Keyword only: KDA has it before
        # gate_domain, GDN2 after.
        kwargs["gate_lower_bound"] = case.support.gate_lower_bound
    if case.beta_guard:
        kwargs["beta_guard"] = True
    return kwargs


def conform(op: str, tensors: dict, io: torch.dtype, engine: str | None = None) -> tuple[dict, list[str]]:
    """Cast each optional/gate tensor the op (or the pinned ``engine``) would reject to an accepted dtype; say so
    for each."""
    out, notes = dict(tensors), []
    for name in ("g", "beta", "w", "a_log", "dt_bias", "initial_state"):
        x = out.get(name)
        if x is None:
            continue
        accepted = accepted_dtypes(op, name, io, engine)
        if x.dtype not in accepted:
            target = accepted[0]
            out[name] = with_margin(x, target)  # the cast keeps the NaN margin
            who = f"{engine} ({op}) takes" if accepted != accepted_dtypes(op, name, io) else f"{op} accepts"
            notes.append(f"{name} cast {short_name(x.dtype)} -> {short_name(target)}: cuDNN {who} "
                         f"{'/'.join(short_name(d) for d in accepted)}")
    return out, notes


def short_name(dtype: torch.dtype) -> str:
    return {_F32: "fp32", _BF16: "bf16", _F16: "fp16", torch.float64: "fp64"}.get(dtype, str(dtype))

"""A catalogue of mutant backends: the reference with one realistic kernel bug injected each.

The harness earns trust by catching every one of them (tests/test_mutants.py). Bugs inside the
recurrence are injected by running the reference front end with a mutated token loop; bugs at the
boundary (layouts, state handling, gradients) wrap the clean oracle backend.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from deltacheck.cases import Case
from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.reference import layouts
from deltacheck.reference import ops as reference_ops

ORACLE = get_backend("oracle")


def mutated_core(*, decay_after_erase=False, erase_reads_undecayed=False, chunk_gate_dropped=False,
                 state_one_token_early=False, erase_without_beta=False, state_bf16_between_chunks=False,
                 nan_below=None):
    """The token oracle with one ordering/indexing bug switched on."""

    def core(q, k, v, g, b, w, h0, scale):
        state, outs, prev = h0, [], h0
        for t in range(q.shape[1]):
            prev = state
            k_t, g_t = k[:, t], g[:, t]
            if state_bf16_between_chunks and t > 0 and t % 64 == 0:
                state = state.to(torch.bfloat16).to(state.dtype)  # the state kept in bf16 between chunks
            if nan_below is not None:  # exp(-cumsum g) overflows once one decay is deep: that head goes all NaN
                deep = (g_t < nan_below).flatten(2).any(-1)[..., None, None]
                state = torch.where(deep, torch.full_like(state, math.nan), state)
            if chunk_gate_dropped and t > 0 and t % 64 == 0:
                g_t = torch.zeros_like(g_t)  # the first token of each 64-token chunk loses its decay
            decay = torch.exp(g_t).unsqueeze(-1)
            erase_key = k_t if erase_without_beta else b[:, t] * k_t
            if erase_reads_undecayed:
                erased = torch.einsum("nhkv,nhk->nhv", state, erase_key)
                state = state * decay
            elif decay_after_erase:
                erased = torch.einsum("nhkv,nhk->nhv", state, erase_key)
            else:
                state = state * decay
                erased = torch.einsum("nhkv,nhk->nhv", state, erase_key)
            state = state + k_t.unsqueeze(-1) * (w[:, t] * v[:, t] - erased).unsqueeze(-2)
            if decay_after_erase:
                state = state * decay
            outs.append(torch.einsum("nhkv,nhk->nhv", state, q[:, t]) * scale)
        out = torch.stack(outs, dim=1) if outs else v.new_zeros(v.shape)
        return out, (prev if state_one_token_early else state)

    return core


@contextlib.contextmanager
def patched_core(core):
    original = reference_ops.token_oracle
    reference_ops.token_oracle = core
    try:
        yield
    finally:
        reference_ops.token_oracle = original


def _scale(case) -> float:
    return case.scale if case.scale is not None else 1.0 / math.sqrt(case.K)


class _FlipGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # factor: a number, or a function of the gradient
        return (ctx.factor(grad) if callable(ctx.factor) else grad * ctx.factor), None


def _per_sequence_carry(case, inputs):
    """Packed sequences run one after another, each starting from the previous one's final state."""
    if case.layout != "thd":
        dense = {n: (layouts.to_thd(x, case.layout) if n in ("q", "k", "v", "g", "beta", "w") and x is not None else x)
                 for n, x in inputs.items()}
        dense["cu_seqlens"] = layouts.dense_cu_seqlens(case.N, case.seqlens[0])
        thd_case = case.replace(layout="thd")
        out, state = _per_sequence_carry(thd_case, dense)
        return layouts.from_thd(out, case.layout, case.N), state
    cu = inputs["cu_seqlens"].tolist()
    outs, states = [], []
    carried = inputs.get("initial_state")
    carried = carried[:1] if carried is not None else None
    for n in range(case.N):
        a, b = cu[n], cu[n + 1]
        if a == b:  # an empty sequence: its final state is whatever it started from
            states.append(layouts.state_convert(carried, "vk", "kv").to(torch.float64) if carried is not None
                          else torch.zeros(1, case.HO, case.K, case.V, dtype=torch.float64))
            continue
        part = {name: (x[a:b] if name in ("q", "k", "v", "g", "beta", "w") and x is not None else x)
                for name, x in inputs.items()}
        part["cu_seqlens"] = torch.tensor([0, b - a], dtype=inputs["cu_seqlens"].dtype)
        part["initial_state"] = carried
        o, s = ORACLE.run(case.replace(seqlens=(b - a,), splits=()), part)
        outs.append(o)
        states.append(s)
        carried = layouts.state_convert(s, "kv", "vk")  # the bug: the next sequence starts from this one
    return torch.cat(outs), torch.cat(states)


HEAD_AXIS = {"thd": 1, "bshd": 2, "sbhd": 2, "bhsd": 1}


def _tile_heads(case, inputs):
    """GQA/GVA heads tiled (h % H) instead of grouped (h // (HO // H))."""
    axis = HEAD_AXIS[case.layout]
    out = dict(inputs)
    for name in ("q", "k", "v"):
        x = inputs[name]
        reps = case.HO // x.shape[axis]
        out[name] = x.repeat(*[reps if d == axis else 1 for d in range(x.dim())])
    return ORACLE.run(case.replace(H=case.HO, HK=case.HO, HV=case.HO), out)


def _unwritten_tail(case, inputs):
    out, state = ORACLE.run(case, inputs)
    packed = layouts.to_thd(out, case.layout).clone()
    tail = max(1, packed.shape[0] // 8)
    packed[-tail:] = math.nan  # the adapter prefilled NaN; the kernel never wrote the last tokens
    return layouts.from_thd(packed, case.layout, case.N), state


def _nan_at_one_token(case, inputs):
    out, state = ORACLE.run(case, inputs)
    packed = layouts.to_thd(out, case.layout).clone()
    packed[packed.shape[0] // 2, 0, 0] = math.nan
    return layouts.from_thd(packed, case.layout, case.N), state


def _nondeterministic(case, inputs):
    out, state = ORACLE.run(case, inputs)
    # An unordered atomic reduction: the last bits change from run to run.
    noise = 1 + 1e-12 * torch.randn(out.shape, dtype=out.dtype, device=out.device)
    return out * noise, state


def _with_core(**bug):
    def run(case, inputs):
        with patched_core(mutated_core(**bug)):
            return ORACLE.run(case, inputs)

    return run


def _with_grad_factor(name, factor):
    def run(case, inputs):
        if inputs.get(name) is None:
            return ORACLE.run(case, inputs)
        return ORACLE.run(case, dict(inputs, **{name: _FlipGrad.apply(inputs[name], factor)}))

    return run


def _w_ignored(case, inputs):
    if case.op != "gdn2":
        return ORACLE.run(case, inputs)
    return ORACLE.run(case, dict(inputs, w=torch.ones_like(inputs["w"])))


def _empty_shifts_bounds(case, inputs):
    """vLLM-like: the chunk/sequence table is misnumbered after an empty sequence, which takes the next token."""
    cu = inputs.get("cu_seqlens")
    if cu is None:
        return ORACLE.run(case, inputs)
    bounds, total = cu.tolist(), cu[-1].item()
    for n in range(len(bounds) - 2):
        if bounds[n] == bounds[n + 1] and bounds[n + 1] < bounds[n + 2]:
            bounds[n + 1] += 1
    shifted = torch.tensor(bounds, dtype=cu.dtype)
    lens = tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))
    assert sum(lens) == total
    return ORACLE.run(case.replace(seqlens=lens, splits=()), dict(inputs, cu_seqlens=shifted))


def _empty_state_unwritten(case, inputs):
    """FlashInfer-like: an empty sequence's final state is never written: whatever torch.empty held (here fresh
    unseeded noise, so it also differs from run to run) comes back instead of its initial state."""
    out, state = ORACLE.run(case, inputs)
    empty = [n for n, length in enumerate(case.seqlens) if length == 0] if case.layout == "thd" else []
    if empty:
        state = state.clone()
        state[empty] = torch.randn(state[empty].shape, dtype=state.dtype, device=state.device)
    return out, state


def _h0_from_row0(case, inputs):
    h0 = inputs.get("initial_state")
    if h0 is None:
        return ORACLE.run(case, inputs)
    return ORACLE.run(case, dict(inputs, initial_state=h0[:1].expand_as(h0)))


def _short_call_drops_h0(case, inputs):
    """A single-chunk fast path (every sequence <= 64 tokens: decode, short continuations) drops the initial state."""
    if max(case.seqlens) <= 64:
        return ORACLE.run(case, dict(inputs, initial_state=None))
    return ORACLE.run(case, inputs)


def _partial_chunk_zero(case, inputs):
    """The last partial 64-token chunk of every sequence is left as the zeros the output was allocated with."""
    out, state = ORACLE.run(case, inputs)
    packed = layouts.to_thd(out, case.layout) * 1.0
    start = 0
    for length in (case.seqlens if case.layout == "thd" else case.seqlens * case.N):
        if length % 64:
            mask = torch.ones_like(packed)
            mask[start + length - length % 64:start + length] = 0
            packed = packed * mask
        start += length
    return layouts.from_thd(packed, case.layout, case.N), state


def _q_not_normalized(case, inputs):
    """use_qk_l2norm_in_kernel normalizes k but not q: every output row scaled by its raw |q|."""
    out, state = ORACLE.run(case, inputs)
    if not case.l2norm:
        return out, state
    q = layouts.to_thd(inputs["q"], case.layout)
    norm = q.to(out.dtype).norm(dim=-1, keepdim=True).repeat_interleave(case.HO // case.H, dim=1)
    packed = layouts.to_thd(out, case.layout) * norm
    return layouts.from_thd(packed, case.layout, case.N), state


def _beta_sigmoid_twice(case, inputs):
    if not case.beta_sigmoid:
        return ORACLE.run(case, inputs)
    return ORACLE.run(case, dict(inputs, beta=torch.sigmoid(inputs["beta"])))


def _dt_bias_ignored(case, inputs):
    if inputs.get("dt_bias") is None:
        return ORACLE.run(case, inputs)
    return ORACLE.run(case, dict(inputs, dt_bias=inputs["dt_bias"] * 0))


def _safe_gate_not_forwarded(case, inputs):
    """The adapter drops safe_gate: the raw pre-activation is used as the log-decay itself."""
    if not case.safe_gate:
        return ORACLE.run(case, inputs)
    plain = case.replace(safe_gate=False, a_log=False, dt_bias=False)
    return ORACLE.run(plain, dict(inputs, a_log=None, dt_bias=None))


def _at_head_dim(dim, names, factor):
    """Gradients of ``names`` off by ``factor`` only when K == V == dim (a tile config used at one head dim)."""
    def run(case, inputs):
        if not (case.K == case.V == dim):
            return ORACLE.run(case, inputs)
        return ORACLE.run(case, dict(inputs, **{n: _FlipGrad.apply(inputs[n], factor) for n in names}))

    return run


def _with_precision(dtype):
    """The whole recurrence computed in ``dtype`` (bf16 staging inside an fp16 kernel), the rest as the baseline."""
    from deltacheck import reference
    from deltacheck.harness.backends.reference import reference_arguments

    def run(case, inputs):
        args, kwargs = reference_arguments(case, inputs, compute_dtype=dtype, method="chunked")
        out, final_vk = getattr(reference, case.op)(*args, **kwargs)
        return out, layouts.state_convert(final_vk, "vk", "kv")

    return run


def _error_times(factor):
    """A kernel whose rounding error is ``factor`` x a same-precision PyTorch run's (the baseline), in the same
    direction: e.g. TF32 dots or one more io-dtype rounding of an intermediate."""
    baseline = get_backend("baseline")

    def run(case, inputs):
        (o, s), (ob, sb) = ORACLE.run(case, inputs), baseline.run(case, inputs)
        return o + factor * (ob.to(o.dtype) - o), s + factor * (sb.to(s.dtype) - s)

    return run


def _l2norm_in_place(case, inputs):
    """use_qk_l2norm_in_kernel done in place: the caller's q and k come back normalized (idempotent, so a second call
    computes the same)."""
    if case.l2norm:
        with torch.no_grad():
            for name in ("q", "k"):
                x = inputs[name]
                x.copy_(torch.nn.functional.normalize(x.float(), dim=-1, eps=1e-6).to(x.dtype))
    return ORACLE.run(case, inputs)


def _pads_g_past_end(case, inputs):
    """g padded to a whole 64-token chunk in place: zeros stored past its end (into whatever lies there)."""
    g = inputs["g"]
    buf = g._base
    if buf is not None and buf.dim() == 1:
        start = g.storage_offset() - buf.storage_offset()
        per_token = g.numel() // max(1, case.total_tokens)
        pad = (-case.total_tokens) % 64 * per_token
        with torch.no_grad():
            buf[start + g.numel():start + g.numel() + pad] = 0
    return ORACLE.run(case, inputs)


def _flag_dropped(field, when):
    """The adapter does not forward one of the case's flags: the kernel runs with the field's default."""
    def run(case, inputs):
        if not when(case):
            return ORACLE.run(case, inputs)
        return ORACLE.run(case.replace(**{field: Case.__dataclass_fields__[field].default}), inputs)

    return run


def _empty_rows_zero(case):
    """A gradient function that zeroes the initial-state gradient of every empty sequence."""
    empty = [n for n, length in enumerate(case.seqlens) if length == 0] if case.layout == "thd" else []

    def zero_rows(grad):
        keep = torch.ones(grad.shape[0], *([1] * (grad.dim() - 1)), dtype=grad.dtype, device=grad.device)
        keep[empty] = 0
        return grad * keep

    return zero_rows


def _empty_dh0_zero(case, inputs):
    """The backward skips empty sequences: their initial state's gradient (the final state's, passed through) is 0."""
    if inputs.get("initial_state") is None:
        return ORACLE.run(case, inputs)
    h0 = _FlipGrad.apply(inputs["initial_state"], _empty_rows_zero(case))
    return ORACLE.run(case, dict(inputs, initial_state=h0))


def _bwd_garbage_h0(case, inputs):
    """Without an initial state the backward reads an unset h0 buffer (garbage) where the forward used zeros: the
    output and state are right, every gradient is the garbage-h0 run's."""
    out, state = ORACLE.run(case, inputs)
    if inputs.get("initial_state") is not None or not torch.is_grad_enabled():
        return out, state
    shape = (case.N, case.HO, case.V, case.K)
    garbage = torch.Generator().manual_seed(0)
    h0 = torch.randn(shape, generator=garbage, dtype=torch.float32).to(inputs["q"].device)
    o2, s2 = ORACLE.run(case, dict(inputs, initial_state=h0))
    return out.detach() + (o2 - o2.detach()), state.detach() + (s2 - s2.detach())


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    inject: Callable

    ops = frozenset({"gdn", "kda", "gdn2"})

    def check(self, case, env) -> Verdict:
        return Verdict.ok()

    def run(self, case, inputs):
        return self.inject(case, inputs)


MUTANTS = [
    Mutant("state_transposed", "final state returned value-major where key-major is promised",
           lambda c, i: (lambda o, s: (o, s.transpose(-1, -2)))(*ORACLE.run(c, i))),
    Mutant("decay_after_erase", "decay applied after the erase and write", _with_core(decay_after_erase=True)),
    Mutant("erase_reads_undecayed", "the erase reads the state before this token's decay",
           _with_core(erase_reads_undecayed=True)),
    Mutant("scale_twice", "scale applied twice", lambda c, i: (lambda o, s: (o * _scale(c), s))(*ORACLE.run(c, i))),
    Mutant("scale_missing", "scale not applied", lambda c, i: (lambda o, s: (o / _scale(c), s))(*ORACLE.run(c, i))),
    Mutant("chunk_boundary_off_by_one", "first token of every 64-token chunk loses its decay",
           _with_core(chunk_gate_dropped=True)),
    Mutant("state_leaks_between_sequences", "each packed sequence starts from the previous one's final state",
           _per_sequence_carry),
    Mutant("initial_state_ignored", "initial state dropped", lambda c, i: ORACLE.run(c, dict(i, initial_state=None))),
    Mutant("final_state_one_token_early", "final state taken before the last token's update",
           _with_core(state_one_token_early=True)),
    Mutant("beta_on_v_only", "beta scales the write but not the erase", _with_core(erase_without_beta=True)),
    Mutant("w_ignored", "GDN2's write gate w ignored (treated as 1)", _w_ignored),
    Mutant("nan_at_one_token", "one output element is NaN", _nan_at_one_token),
    Mutant("unwritten_output_tail", "the last eighth of the output tokens never written (NaN prefill)",
           _unwritten_tail),
    Mutant("dg_wrong_sign", "gate gradient with the wrong sign", _with_grad_factor("g", -1.0)),
    Mutant("dbeta_halved", "beta gradient halved", _with_grad_factor("beta", 0.5)),
    Mutant("nondeterministic", "output varies in its last bits between runs", _nondeterministic),
    Mutant("heads_tiled", "GQA/GVA heads mapped h % H (tiled) instead of h // (HO/H) (grouped)", _tile_heads),
    # Modelled on the defects found on the H200 this week (docs/libraries.md, harness/ci/known_issues.toml).
    Mutant("empty_seq_shifts_bounds", "after an empty sequence the bounds shift: it takes the next sequence's first "
           "token (vLLM's chunk table misnumbered after an empty sequence)", _empty_shifts_bounds),
    Mutant("empty_seq_state_unwritten", "an empty sequence's final state never written (FlashInfer prefill)",
           _empty_state_unwritten),
    Mutant("grads_wrong_at_k96", "dk, dv and dbeta 10% off only at K = V = 96 (cuDNN cuTile GDN)",
           _at_head_dim(96, ("k", "v", "beta"), 1.1)),
    Mutant("nan_below_decay", "a head goes NaN once one log-decay is below -7.15 (exp(-cumsum g) overflows)",
           _with_core(nan_below=-7.15)),
    Mutant("fp16_computed_in_bf16", "an fp16 kernel staging its recurrence in bf16", _with_precision(torch.bfloat16)),
    Mutant("state_bf16_between_chunks", "the state rounded to bf16 between 64-token chunks (FlashKDA)",
           _with_core(state_bf16_between_chunks=True)),
    Mutant("error_3x_baseline", "rounding error 3x a same-precision implementation's (e.g. TF32 dots)",
           _error_times(3.0)),
    Mutant("dt_bias_ignored", "the safe gate's dt_bias ignored (treated as 0)", _dt_bias_ignored),
    Mutant("safe_gate_not_forwarded", "safe_gate dropped: the raw pre-activation used as the log-decay",
           _safe_gate_not_forwarded),
    Mutant("da_log_zero", "no gradient flows to a_log (zeros)", _with_grad_factor("a_log", 0.0)),
    Mutant("beta_sigmoid_twice", "use_beta_sigmoid_in_kernel applied on top of an adapter's own sigmoid",
           _beta_sigmoid_twice),
    Mutant("q_not_l2normed", "use_qk_l2norm_in_kernel normalizes k but not q", _q_not_normalized),
    Mutant("h0_from_row0", "every sequence's initial state read from row 0", _h0_from_row0),
    Mutant("dh0_zero", "the initial state's gradient left zero", _with_grad_factor("initial_state", 0.0)),
    Mutant("short_call_drops_h0", "a single-chunk fast path (every sequence <= 64 tokens) drops the initial state",
           _short_call_drops_h0),
    Mutant("partial_chunk_zero", "each sequence's last partial 64-token chunk left as allocated zeros",
           _partial_chunk_zero),
    Mutant("l2norm_in_place", "q and k l2-normalized in place: the caller's tensors overwritten", _l2norm_in_place),
    Mutant("pads_g_past_end", "g zero-padded to a whole chunk in place, past its end", _pads_g_past_end),
    Mutant("neg_eigval_dropped", "allow_neg_eigval not forwarded: beta = sigmoid(x), not 2 sigmoid(x)",
           _flag_dropped("neg_eigval", lambda c: c.neg_eigval)),
    Mutant("custom_scale_dropped", "the caller's scale not forwarded: the kernel uses 1/sqrt(K)",
           _flag_dropped("scale", lambda c: c.scale is not None)),
    Mutant("linear_gate_read_as_log", "gate_domain='linear' not forwarded: alpha read as a log-decay",
           _flag_dropped("gate_domain", lambda c: c.gate_domain == "linear")),
    Mutant("empty_seq_dh0_zero", "the backward skips empty sequences: their initial state's gradient left zero",
           _empty_dh0_zero),
    Mutant("bwd_garbage_without_h0", "with no initial state the backward reads an unset h0 (garbage); the forward "
           "used zeros", _bwd_garbage_h0),
]


def _noisy(grad):
    """The gradient's last bits changed from call to call (an unordered atomic accumulation)."""
    return grad * (1 + 1e-12 * torch.randn(grad.shape, dtype=grad.dtype, device=grad.device))


# Bugs the checks do not catch today (docs/verdicts.md, "Known gaps"); tests/test_mutants.py holds each as a strict
# xfail.
GAPS = [
    Mutant("nondeterministic_backward", "dk accumulated with unordered atomics: the gradient's last bits vary per call",
           lambda c, i: ORACLE.run(c, dict(i, k=_FlipGrad.apply(i["k"], _noisy)))),
    Mutant("output_flushed_to_zero", "the output flushed to zero (an underflow/FTZ bug at small magnitudes)",
           lambda c, i: (lambda o, s: (o * 0, s))(*ORACLE.run(c, i))),
]

"""Deterministic inputs for a Case.

Every tensor is drawn in float32 on a CPU `torch.Generator`, then cast, laid out, and moved to the
device, so one id gives bitwise the same tensors on every machine (for a given torch version).

Seeding: each named tensor has its own generator stream, seeded from sha256(stream key | name) plus
`case.seed`. The stream key is the id of the case with layout, gate domain, state dtype, splits,
backward, seed and tier neutralised (see `stream_key`), so the same problem in another layout gets the
very same numbers: a layout adapter bug then shows up as a difference, not as noise. Python's hash() is never used (it is salted per process).

Gate profiles (the log-space decay g_eff <= 0 they produce, drawn per element of g's shape):

    mild     log U(0.5, 1)                          (TransformerEngine's GDN2 tests)
    typical  logsigmoid(N(0, 1))
    steep    U(-5, -0.1)                            (FLA's GDN2 tests)
    extreme  steep, then -1000 on ~5% of tokens (whole head row) and ~5% of single entries
    zero     0 (no decay)
    long     -exp(U(log 1e-4, log 0.05)) per element: a state lives for thousands of tokens
    trained  shaped like trained models' gates: each (head, channel) has a rate, 85% near zero
             (-exp(U(log 1e-4, log 1e-2))) and 15% steep (U(-5, -1)), jittered per token by exp(0.3 N(0, 1))
    unif<x>  U(-x, -0.1): the stability frontier's search profile (log domain only)

With gate_domain="linear", g holds alpha = exp(g_eff) in [0, 1] (exp(-1000) underflows to 0 on purpose:
the kernels floor it with +1e-10). With safe_gate, g holds a raw pre-activation instead, drawn so the
gate formula lands in the same regime: zero -1000, mild U(-6, -2), typical N(0, 1), steep U(0, 5),
extreme steep with +1000 at the same kind of positions, long U(-11, -4) (sigmoid/softplus ~ 1e-5..1e-2),
trained 85% U(-11, -6) and 15% U(0, 3) per (head, channel). a_log ~ log U(1, 4) (so exp(a_log) in [1, 4]),
dt_bias ~ U(-1, 1).

``magnitude`` (id token ``mag<x>``) multiplies v and q, and k when the kernel normalizes it (l2norm): the same
draws at another scale, to find where fp16/bf16 overflow or underflow. A raw k keeps unit norm either way, so
the recurrence stays contractive.

Beta profiles (effective beta; with beta_sigmoid the tensor holds the logit that produces it, with
neg_eigval beta_eff = 2 * sigmoid(logit)):

    uniform  U(0, 1) (U(0, 2) with neg_eigval)
    zero     0 (logit -30 under sigmoid)
    one      1 (logit +30 under sigmoid, 0 with neg_eigval)
    near2    U(1.9, 2) (needs neg_eigval; logit = logit(beta/2))

The GDN2 write gate w takes the same effective values as beta, stored directly (no sigmoid applies to
w): uniform U(0, 1), zero 0, one 1, near2 U(1.9, 2).

q, v ~ N(0, 1). k ~ N(0, 1) when l2norm is on (the kernel normalises it); otherwise k is normalised
per token and head before the cast, so the recurrence stays contractive as it is in a model.

GDP (``num_householder = n``): k, v and beta carry n sub-token rows per real token, expanded as cuDNN's op and
the reference take them (``k [T*n, HK, K]``, ``v [T*n, HV, V]``, ``beta [T*n, HO]``; token t's rows are
``t*n .. t*n+n-1``), each row drawn as above; q and g stay per real token. GDP cases are thd only.
"""

from __future__ import annotations

import hashlib
import math

import torch

from .spec import Case, gate_floor

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

_SIGMOID_SATURATE = 30.0  # sigmoid(+-30) is 1 / 0 to within 1e-13
_EXTREME_DECAY = -1000.0
_EXTREME_FRACTION = 0.05


def stream_key(case: Case) -> str:
    """The part of the id that determines the numbers.

    Axes that only re-arrange or re-encode the same draws are neutralised: layout (a reshape), gate
    domain (alpha = exp(g) of the same g), state dtype (a cast of the same h0), and the check axes
    (splits, backward, tier), the serving axes (a serving case gets its training twin's tokens; its pool draws
    have their own stream), and the magnitude (a multiple of the same draws). So e.g. a linear-domain case is
    bitwise exp() of its log-domain twin.
    """
    return case.replace(layout="thd", gate_domain="log", state_dtype="fp32", splits=(), backward=False,
                        seed=0, tier="L0", magnitude=None, pool=0, nulls=0, chain=0, draft=0, accepted=(),
                        checkpoint_every=0).id


def stream_seed(case: Case, name: str) -> int:
    digest = hashlib.sha256(f"{stream_key(case)}|{name}".encode()).digest()
    return (int.from_bytes(digest[:8], "little") + case.seed) % (2**63)


def _generator(case: Case, name: str) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    generator.manual_seed(stream_seed(case, name))
    return generator


def _uniform(shape, low, high, generator):
    return torch.rand(shape, generator=generator, dtype=torch.float32) * (high - low) + low


def _normal(shape, generator):
    return torch.randn(shape, generator=generator, dtype=torch.float32)


def _to_layout(x: torch.Tensor, case: Case) -> torch.Tensor:
    """Packed [T, heads, ...] -> the case's layout (dense layouts: N equal sequences of length L)."""
    if case.layout == "thd":
        return x.contiguous()
    n, length = case.N, case.seqlens[0]
    x = x.reshape(n, length, *x.shape[1:])  # bshd
    if case.layout == "sbhd":
        x = x.transpose(0, 1)
    elif case.layout == "bhsd":
        x = x.transpose(1, 2)
    return x.contiguous()


def _extreme_mask(shape, generator) -> torch.Tensor:
    """~5% whole (token, head) rows plus ~5% single entries."""
    rows = torch.rand(shape[:2], generator=generator) < _EXTREME_FRACTION
    if len(shape) > 2:
        rows = rows.unsqueeze(-1).expand(shape)
    singles = torch.rand(shape, generator=generator) < _EXTREME_FRACTION
    return rows | singles


def _trained_rates(shape, generator, near_zero, steep) -> torch.Tensor:
    """Per-(head, channel) rates, 85% drawn by ``near_zero`` and 15% by ``steep``, shared by every token."""
    rate_shape = shape[1:]
    near, far = near_zero(rate_shape, generator), steep(rate_shape, generator)
    pick_steep = torch.rand(rate_shape, generator=generator) < 0.15
    return torch.where(pick_steep, far, near).expand(shape)


def _log_uniform(shape, low, high, generator) -> torch.Tensor:
    return torch.exp(_uniform(shape, math.log(low), math.log(high), generator))


def _log_decay(profile: str, shape, generator) -> torch.Tensor:
    if profile == "zero":
        return torch.zeros(shape, dtype=torch.float32)
    if profile == "mild":
        return torch.log(_uniform(shape, 0.5, 1.0, generator))
    if profile == "typical":
        return torch.nn.functional.logsigmoid(_normal(shape, generator))
    if profile == "long":
        return -_log_uniform(shape, 1e-4, 0.05, generator)
    if profile == "trained":
        rates = _trained_rates(shape, generator, lambda sh, gen: -_log_uniform(sh, 1e-4, 1e-2, gen),
                               lambda sh, gen: _uniform(sh, -5.0, -1.0, gen))
        return rates * torch.exp(0.3 * _normal(shape, generator))
    if (low := gate_floor(profile)) is not None:
        return _uniform(shape, low, -0.1, generator)
    steep = _uniform(shape, -5.0, -0.1, generator)
    if profile == "steep":
        return steep
    return torch.where(_extreme_mask(shape, generator), torch.full_like(steep, _EXTREME_DECAY), steep)


def _safe_gate_preactivation(profile: str, shape, generator) -> torch.Tensor:
    if profile == "zero":
        return torch.full(shape, -1000.0, dtype=torch.float32)
    if profile == "mild":
        return _uniform(shape, -6.0, -2.0, generator)
    if profile == "typical":
        return _normal(shape, generator)
    if profile == "long":
        return _uniform(shape, -11.0, -4.0, generator)
    if profile == "trained":
        return _trained_rates(shape, generator, lambda sh, gen: _uniform(sh, -11.0, -6.0, gen),
                              lambda sh, gen: _uniform(sh, 0.0, 3.0, gen))
    steep = _uniform(shape, 0.0, 5.0, generator)
    if profile == "steep":
        return steep
    return torch.where(_extreme_mask(shape, generator), torch.full_like(steep, 1000.0), steep)


def _effective_beta(case: Case, shape, generator) -> torch.Tensor:
    top = 2.0 if case.neg_eigval else 1.0
    profile = case.beta_profile
    if profile == "uniform":
        return _uniform(shape, 0.0, top, generator)
    if profile == "zero":
        return torch.zeros(shape, dtype=torch.float32)
    if profile == "one":
        return torch.ones(shape, dtype=torch.float32)
    return _uniform(shape, 1.9, 2.0, generator)  # near2


def _beta_tensor(case: Case, shape, generator) -> torch.Tensor:
    beta = _effective_beta(case, shape, generator)
    if not case.beta_sigmoid:
        return beta
    fraction = beta / 2.0 if case.neg_eigval else beta  # the sigmoid's target value in [0, 1]
    logits = torch.logit(fraction.double(), eps=None).float()
    # Exact 0 / 1 give -inf / +inf logits; saturate them to finite values the kernels accept.
    return logits.clamp(-_SIGMOID_SATURATE, _SIGMOID_SATURATE)


def _write_gate(case: Case, shape, generator) -> torch.Tensor:
    profile = case.beta_profile
    if profile == "uniform":
        return _uniform(shape, 0.0, 1.0, generator)
    if profile == "zero":
        return torch.zeros(shape, dtype=torch.float32)
    if profile == "one":
        return torch.ones(shape, dtype=torch.float32)
    return _uniform(shape, 1.9, 2.0, generator)


def _symbolic_shape(case: Case, dims: tuple[str, ...]) -> tuple[int, ...]:
    sizes = {"T": case.total_tokens, "Tn": case.total_tokens * case.num_householder, "HO": case.HO, "K": case.K,
             "V": case.V}
    return tuple(sizes[d] for d in dims)


def make_inputs(case: Case, device="cpu") -> dict:
    """All inputs of `case`, in its layout and dtypes, on `device`. See the module docstring."""
    support = case.support
    T, io = case.total_tokens, TORCH_DTYPES[case.io_dtype]

    rows = T * case.num_householder  # k, v (and beta) rows: one per sub-token, T for every op but GDP
    q = _normal((T, case.H, case.K), _generator(case, "q"))
    k = _normal((rows, case.HK, case.K), _generator(case, "k"))
    if not case.l2norm:
        k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    v = _normal((rows, case.HV, case.V), _generator(case, "v"))
    if case.magnitude is not None:
        q, v = q * case.magnitude, v * case.magnitude
        if case.l2norm:
            k = k * case.magnitude

    gate_shape = _symbolic_shape(case, support.gate_shape)
    if case.safe_gate:
        g = _safe_gate_preactivation(case.gate, gate_shape, _generator(case, "g"))
    else:
        g = _log_decay(case.gate, gate_shape, _generator(case, "g"))
        if case.gate_domain == "linear":
            g = torch.exp(g)

    beta = _beta_tensor(case, _symbolic_shape(case, support.beta_shape), _generator(case, "beta"))
    beta_dtype = torch.float32 if support.beta_dtype == "fp32" else io

    tensors = {
        "q": q.to(io),
        "k": k.to(io),
        "v": v.to(io),
        "g": g,
        "beta": beta.to(beta_dtype),
    }
    if support.write_gate:
        w = _write_gate(case, (T, case.HO, case.V), _generator(case, "w"))
        tensors["w"] = w.to(io)
    tensors = {name: _to_layout(x, case) for name, x in tensors.items()}

    if case.layout == "thd":
        offsets = [0]
        for length in case.seqlens:
            offsets.append(offsets[-1] + length)
        tensors["cu_seqlens"] = torch.tensor(offsets, dtype=torch.int32)
    else:
        tensors["cu_seqlens"] = None

    if case.initial_state:
        h0 = _normal((case.N, case.HO, case.V, case.K), _generator(case, "initial_state"))
        tensors["initial_state"] = h0.to(TORCH_DTYPES[case.state_dtype])
    else:
        tensors["initial_state"] = None

    tensors["a_log"] = (
        torch.log(_uniform((case.HO,), 1.0, 4.0, _generator(case, "a_log"))) if case.a_log else None
    )
    tensors["dt_bias"] = (
        _uniform(_symbolic_shape(case, support.dt_bias_shape), -1.0, 1.0, _generator(case, "dt_bias"))
        if case.dt_bias
        else None
    )
    return {name: (x.to(device) if x is not None else None) for name, x in tensors.items()}


def make_weights(case: Case, out_shape, state_shape, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random fp32 loss weights (Wo, Ws) for the backward check: loss = (out*Wo).sum() + (state*Ws).sum().

    Drawn from their own streams (N(0, 1)), so they never disturb the inputs.
    """
    wo = _normal(tuple(out_shape), _generator(case, "weights_out"))
    ws = _normal(tuple(state_shape), _generator(case, "weights_state"))
    return wo.to(device), ws.to(device)


def tensor_digest(tensors: dict) -> str:
    """sha256 over names, dtypes, shapes and raw bytes of the tensors (None entries included)."""
    hasher = hashlib.sha256()
    for name in sorted(tensors):
        x = tensors[name]
        hasher.update(name.encode())
        if x is None:
            hasher.update(b"<none>")
            continue
        x = x.detach().cpu().contiguous()
        hasher.update(f"{x.dtype}{tuple(x.shape)}".encode())
        hasher.update(x.view(torch.uint8).numpy().tobytes() if x.numel() else b"")
    return hasher.hexdigest()

"""A contract double of JAX (the few members deltacheck's bridge touches) and of jax-linear-attention 0.1.0's
``jla.ops.linear_attention``, computing with OUR reference — real JAX is not installed in CI.

What it pins (jla 0.1.0; docs/libraries.md has the file:line of each):

- ``linear_attention(kind, q, k, v, *, impl, **inputs)``: the kinds ``gated_deltanet``, ``kda``, ``gdn2``,
  ``gated_deltaproduct`` and their gate keywords (``g, beta``; GDN2 ``g, b, w``; a missing or extra gate is
  jla's ValueError); ``impl`` must be ``"mosaic_gpu"`` here (the adapter never lets jla fall back to its
  chunked JAX path); ``cu_seqlens`` refused as the kernels refuse it.
- FLA's layout ``[B, T, H, D]``; q and k one shape, v a multiple of their heads (GDN, GDP), one head count for
  KDA and GDN2; GDP's k, v, beta with ``num_householder`` consecutive rows per token.
- ``g`` the **log-space** decay (the double checks ``g <= 0`` for the scalar and vector gates: a linear-domain
  alpha in (0, 1] passed instead is refused, as it would silently decay far too little in the real kernels).
- the state **key-major** ``[B, H, K, V]`` in and out (a value-major state of another shape is refused; one of
  the same shape, K == V, is simply wrong and the comparison catches it).
- dtypes: bf16/fp16 for GDN and GDP, bf16 only for KDA and GDN2; K, V in {64, 128} (GDN also the large heads).

And of JAX: ``jit`` (records calls, runs eagerly), ``vjp`` (torch autograd under the hood), ``dlpack.from_dlpack``
(zero-copy: the array shares the torch tensor's memory; refuses a non-contiguous tensor, the layout the bridge
promises XLA), ``numpy.zeros``, ``config.update``; arrays implement ``__dlpack__`` so ``torch.from_dlpack``
reads them back. Results are fp64 (doubles/__init__.py).
"""

from __future__ import annotations

import os
import types

import torch

from deltacheck import reference

VERSION = "0.1.0"
KIND_GATES = {"gated_deltanet": ("g", "beta"), "kda": ("g", "beta"), "gdn2": ("g", "b", "w"),
              "gated_deltaproduct": ("g", "beta")}
_HEAD_DIMS = {(64, 64), (64, 128), (128, 64), (128, 128)}
_LARGE = {(256, 128), (256, 256), (256, 512), (128, 256)}


class Array:
    """A JAX array stand-in holding a torch tensor (shared memory, never copied by the bridge's hand-offs)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.ready_calls = 0

    shape = property(lambda self: tuple(self.tensor.shape))
    dtype = property(lambda self: self.tensor.dtype)
    ndim = property(lambda self: self.tensor.dim())

    def astype(self, dtype):
        return Array(self.tensor.to(dtype))

    def block_until_ready(self):
        self.ready_calls += 1
        return self

    def __dlpack__(self, *args, **kwargs):
        return self.tensor.detach().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


def _t(x):
    return None if x is None else x.tensor


def make_jax(environ=None):
    """A fake ``jax`` module; ``jax.calls`` records jit/vjp use, ``jax.config.values`` the config updates."""
    jax = types.ModuleType("jax")
    jax.__version__ = "0.11.2"
    jax.calls = []
    jax.environ_at_import = dict(os.environ if environ is None else environ)
    jax.config = types.SimpleNamespace(values={})
    jax.config.update = lambda name, value: jax.config.values.__setitem__(name, value)

    def from_dlpack(tensor):
        if not tensor.is_contiguous():
            raise ValueError("from_dlpack: the double takes row-major (contiguous) tensors only")
        return Array(torch.from_dlpack(tensor))

    jax.dlpack = types.SimpleNamespace(from_dlpack=from_dlpack)
    jax.numpy = types.SimpleNamespace(zeros=lambda shape, dtype: Array(torch.zeros(shape, dtype=dtype)))

    def jit(fn):
        def jitted(*args):
            jax.calls.append("jit")
            return fn(*args)
        return jitted

    def vjp(fn, *primals):
        jax.calls.append("vjp")
        leaves = [None if p is None else Array(p.tensor.detach().clone().requires_grad_(p.tensor.is_floating_point()))
                  for p in primals]
        with torch.enable_grad():  # the bridge calls vjp inside an autograd.Function's forward (grad off there)
            outputs = fn(*leaves)
        tensors = [o.tensor for o in outputs]

        def pullback(cotangents):
            wrt = [(i, p.tensor) for i, p in enumerate(leaves) if p is not None and p.tensor.requires_grad]
            with torch.enable_grad():
                grads = torch.autograd.grad(tensors, [t for _, t in wrt], [c.tensor.to(t.dtype) for c, t in
                                                                             zip(cotangents, tensors)],
                                            allow_unused=True)
            out = [None] * len(leaves)
            for (i, _), grad in zip(wrt, grads):
                out[i] = Array(torch.zeros_like(leaves[i].tensor) if grad is None else grad)
            return tuple(out)

        return tuple(Array(t.detach()) for t in tensors), pullback

    jax.jit, jax.vjp = jit, vjp
    return jax


def _refuse(kind, why):
    raise ValueError(f"mosaic_gpu {kind}: {why}")


def make_ops():
    """A fake ``jla.ops``; ``ops.calls`` records each ``linear_attention`` call's arguments as torch tensors."""
    ops = types.ModuleType("jla.ops")
    ops.__version__ = VERSION
    ops.calls = []

    def linear_attention(kind, q, k, v, *, impl="auto", **inputs):
        if kind not in KIND_GATES:
            raise ValueError(f"unknown linear-attention kind {kind!r}")
        names = KIND_GATES[kind]
        missing = [n for n in names if inputs.get(n) is None]
        extra = sorted(n for n in ("g", "beta", "b", "w") if n not in names and inputs.get(n) is not None)
        if missing or extra:
            raise ValueError(f"{kind} takes gates {names}; missing {missing}, unexpected {extra}")
        if impl != "mosaic_gpu":
            raise AssertionError(f"the adapter must ask for impl='mosaic_gpu', got {impl!r}")
        gates = [_t(inputs.pop(n)) for n in names]
        q, k, v = _t(q), _t(k), _t(v)
        h0 = _t(inputs.pop("initial_state", None))
        options = dict(inputs)
        ops.calls.append({"kind": kind, "q": q, "k": k, "v": v, "gates": gates, "initial_state": h0, **options})
        allowed = {"scale", "output_final_state", "use_qk_l2norm", "num_householder", "segment_ids", "cu_seqlens"}
        if set(options) - allowed:
            _refuse(kind, f"unsupported options {sorted(set(options) - allowed)}")
        if options.get("cu_seqlens") is not None:
            _refuse(kind, "cu_seqlens is not supported; pass segment_ids or use the reference")
        return _compute(kind, q, k, v, gates, h0, options)

    ops.linear_attention = linear_attention
    return ops


def _check(kind, q, k, v, gates, h0, n):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if k.shape != (B, T * n, H, K):
        _refuse(kind, f"expected q, k [B, T, Hk, K]; got {tuple(q.shape)}, {tuple(k.shape)}")
    if HV % H or (kind in ("kda", "gdn2") and HV != H):
        _refuse(kind, f"value heads {HV} do not fit key heads {H}")
    dims = _HEAD_DIMS | (_LARGE if kind == "gated_deltanet" else set())
    if (K, V) not in dims:
        _refuse(kind, f"head dims (K, V) = {(K, V)} unsupported")
    allowed = (torch.bfloat16,) if kind in ("kda", "gdn2") else (torch.bfloat16, torch.float16)
    if len({q.dtype, k.dtype, v.dtype}) != 1 or q.dtype not in allowed:
        _refuse(kind, f"q, k, v must share a dtype in {allowed}")
    g = gates[0]
    want_g = (B, T, HV) if kind in ("gated_deltanet", "gated_deltaproduct") else (B, T, H, K)
    if tuple(g.shape) != want_g:
        _refuse(kind, f"g must be {want_g}; got {tuple(g.shape)}")
    if bool((g > 0).any()):
        _refuse(kind, "g is the log-space decay (<= 0); got positive values (a linear-domain alpha?)")
    if h0 is not None and tuple(h0.shape) != (B, HV, K, V):
        _refuse(kind, f"initial_state must be [B, H, K, V] = {(B, HV, K, V)}; got {tuple(h0.shape)}")


def _compute(kind, q, k, v, gates, h0, options):
    n = options.get("num_householder") or 1
    _check(kind, q, k, v, gates, h0, n)
    fn = {"gated_deltanet": reference.gdn, "kda": reference.kda, "gdn2": reference.gdn2,
          "gated_deltaproduct": reference.gdp}[kind]
    outs, states = [], []
    for b in range(q.shape[0]):  # one packed sequence per batch row: the reference's thd
        T = q.shape[1]
        cu = torch.tensor([0, T])
        rows = [x[b] for x in (q, k, v)] + [x[b] for x in gates]
        kwargs = dict(scale=options.get("scale"), output_final_state=True,
                      use_qk_l2norm_in_kernel=options.get("use_qk_l2norm", False), state_layout="kv",
                      initial_state=None if h0 is None else h0[b:b + 1])
        if kind == "gated_deltaproduct":
            o, s = fn(*rows, cu, n, **kwargs)
        else:
            o, s = fn(*rows, cu, **kwargs)
        outs.append(o)
        states.append(s)
    return Array(torch.stack(outs)), Array(torch.cat(states))


def make(environ=None):
    """``(jax, ops)``: the two stand-ins the adapter takes (``JaxBackend(ops, jax=jax)``)."""
    return make_jax(environ), make_ops()

"""torch <-> JAX through DLPack, with JAX's gradients (``jax.vjp``) behind a ``torch.autograd.Function``.

The harness hands torch tensors and differentiates with ``loss.backward()``; jla's kernels are JAX functions
with custom VJPs. ``call`` moves the inputs to JAX without a copy (``jax.dlpack.from_dlpack`` on a contiguous
CUDA tensor), runs the JAX function (under ``jax.vjp`` when any input needs a gradient), and returns the outputs
as torch tensors (``torch.from_dlpack``); the backward hands the cotangents to the saved ``vjp`` function the
same way. Torch and XLA run on different CUDA streams: each hand-off synchronizes the producer first
(``torch.cuda.synchronize`` before JAX reads, ``block_until_ready`` before torch reads), so neither reads a
buffer the other is still writing.

``configure_jax`` must run before the first ``import jax`` in the process: it turns off XLA's preallocation of
75% of the GPU (``XLA_PYTHON_CLIENT_PREALLOCATE=false``), which would otherwise starve torch in the same
process, and puts JAX's persistent compilation cache under deltacheck's cache directory. A value the user set
in the environment is kept (``setdefault``).
"""

from __future__ import annotations

import importlib
import os

import torch

from deltacheck.harness.records.cachedir import cache_root

JAX_ENV_DEFAULTS = {
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # allocate on demand, beside torch's caching allocator
}


def jax_cache_dir() -> str:
    return str(cache_root() / "jax")


def configure_jax(importer=importlib.import_module, environ=os.environ):
    """Set JAX's environment defaults (before its import), import it, and point its compilation cache at
    deltacheck's cache directory. Returns the ``jax`` module (or whatever ``importer`` gives: a test double)."""
    for name, value in JAX_ENV_DEFAULTS.items():
        environ.setdefault(name, value)
    jax = importer("jax")
    config = getattr(jax, "config", None)
    if config is not None:
        config.update("jax_compilation_cache_dir", environ.get("DELTACHECK_JAX_CACHE_DIR", jax_cache_dir()))
        # Mosaic GPU kernels compile in seconds; keep every compiled executable, not only the slow ones.
        config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return jax


def _sync_torch(x: torch.Tensor) -> None:
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


# XLA refuses a DLPack buffer whose address is not a multiple of 256 bytes ("Input buffer 0 is not 256-byte
# aligned", measured on the H200 with jax 0.11.2): the harness's NaN-margin views start mid-allocation.
XLA_ALIGNMENT = 256


def _aligned_copy(x: torch.Tensor) -> torch.Tensor:
    """``x`` copied into a buffer whose first element sits on an ``XLA_ALIGNMENT`` boundary."""
    nbytes = x.numel() * x.element_size()
    raw = torch.empty(nbytes + XLA_ALIGNMENT, dtype=torch.uint8, device=x.device)
    start = -raw.data_ptr() % XLA_ALIGNMENT
    out = raw[start:start + nbytes].view(x.dtype).view(x.shape)
    out.copy_(x)
    return out


def to_jax(jax, x: torch.Tensor | None, *, align: bool | None = None):
    """A torch tensor as a JAX array sharing its memory (contiguous first: DLPack carries strides, XLA wants
    its own row-major layout); a GPU tensor whose address is not 256-byte aligned, which XLA refuses, is copied to
    an aligned buffer first (``align``: force the rule either way); None stays None."""
    if x is None:
        return None
    x = x.detach().contiguous()
    if (x.is_cuda if align is None else align) and x.data_ptr() % XLA_ALIGNMENT:
        x = _aligned_copy(x)
    _sync_torch(x)
    return jax.dlpack.from_dlpack(x)


def to_torch(array) -> torch.Tensor:
    """A JAX array as a torch tensor sharing its memory, once XLA has finished writing it."""
    ready = getattr(array, "block_until_ready", None)
    if ready is not None:
        array = ready()
    return torch.from_dlpack(array)


class _JaxFunction(torch.autograd.Function):
    """``fn(*arrays) -> (out, final_state)`` in JAX; gradients through the ``vjp`` JAX returned."""

    @staticmethod
    def forward(ctx, jax, fn, *tensors):
        primals = [to_jax(jax, t) for t in tensors]
        needs_grad = any(t is not None and t.requires_grad for t in tensors)
        if needs_grad:
            outputs, vjp = jax.vjp(fn, *primals)
            ctx.jax, ctx.vjp = jax, vjp
            ctx.inputs = [None if t is None else (t.dtype, t.device) for t in tensors]
        else:
            outputs = fn(*primals)
        out, state = outputs
        ctx.out_meta = [(t.shape, t.dtype) for t in (out, state)]
        return to_torch(out), to_torch(state)

    @staticmethod
    def backward(ctx, d_out, d_state):
        jax = ctx.jax
        cotangents = []
        for grad, (shape, dtype) in zip((d_out, d_state), ctx.out_meta):
            if grad is None:  # an output the loss did not use: a zero cotangent of its shape and dtype
                cotangents.append(jax.numpy.zeros(shape, dtype))
            else:
                cotangents.append(to_jax(jax, grad).astype(dtype))
        grads = ctx.vjp(tuple(cotangents))
        torch_grads = []
        for grad, meta in zip(grads, ctx.inputs):
            if meta is None or grad is None:
                torch_grads.append(None)
            else:
                torch_grads.append(to_torch(grad).to(dtype=meta[0]))
        return (None, None, *torch_grads)


def call(jax, fn, *tensors: torch.Tensor | None):
    """Run the JAX function ``fn`` on torch tensors (None passes through); differentiable in torch."""
    return _JaxFunction.apply(jax, fn, *tensors)

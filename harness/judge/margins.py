"""NaN margins around every buffer a kernel reads, in the layout the kernel reads it.

The runner allocates each floating-point input inside a larger buffer whose ``margin`` elements on each
side hold NaN (``guarded``), so a kernel that reads past a row's end (or before its start) poisons its
output and fails ``forward`` with a NaN count. An adapter that converts a layout (a transpose made
contiguous, a dtype cast, a reshape that copies) would hand the kernel a fresh allocation with no margin:
``with_margin`` makes that copy inside a margin-bearing buffer instead, and leaves an input that already
sits contiguous between NaN margins as it is (no copy). The copy is an autograd op: gradients reach the
runner's leaves through it.

The margin is the runner's (``RunOptions.margin``, set for the duration of a task by ``use``); outside a
task it is ``DEFAULT``.
"""

from __future__ import annotations

import contextlib
import math

import torch

DEFAULT = 64
_current = [DEFAULT]


def current() -> int:
    """The margin (elements each side) in force."""
    return _current[-1]


@contextlib.contextmanager
def use(margin: int):
    """``margin`` elements each side for every buffer made inside the block."""
    _current.append(int(margin))
    try:
        yield
    finally:
        _current.pop()


def guarded(x: torch.Tensor | None, margin: int | None = None, dtype: torch.dtype | None = None):
    """A contiguous copy of ``x`` (cast to ``dtype`` if given) inside a buffer whose ``margin`` elements on each
    side are NaN. Non-floating tensors (and ``margin == 0``) get a plain contiguous copy / cast."""
    if x is None:
        return None
    margin = current() if margin is None else margin
    dtype = dtype or x.dtype
    if not dtype.is_floating_point or margin == 0:
        return x.to(dtype).contiguous()
    buf = torch.full((x.numel() + 2 * margin,), math.nan, dtype=dtype, device=x.device)
    view = buf[margin: margin + x.numel()].view(x.shape)
    view.copy_(x)  # autograd: CopySlices hands the gradient back to x
    return view


def has_margin(x: torch.Tensor, margin: int) -> bool:
    """Is ``x`` contiguous, with at least ``margin`` NaN elements right before its first and after its last?"""
    if not x.is_contiguous() or x.numel() == 0:
        return False
    start = x.storage_offset()
    total = x.untyped_storage().nbytes() // x.element_size()
    end = start + x.numel()
    if start < margin or total - end < margin:
        return False
    flat = x.detach().as_strided((total,), (1,), 0)
    return bool(torch.isnan(flat[start - margin: start]).all() and torch.isnan(flat[end: end + margin]).all())


def with_margin(x: torch.Tensor | None, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """``x`` contiguous (in ``dtype`` if given) between NaN margins of the current size: ``x`` itself when it
    already is, else a copy made by ``guarded``. Every adapter's input conversion ends here."""
    if x is None:
        return None
    margin = current()
    same_dtype = dtype is None or dtype == x.dtype
    if not x.is_floating_point() or margin == 0:
        return x.contiguous() if same_dtype else x.to(dtype).contiguous()
    if same_dtype and has_margin(x, margin):
        return x
    return guarded(x, margin, dtype)


def read_past_end(x: torch.Tensor, fallback: float = 0.0) -> torch.Tensor:
    """What a kernel reading one element past the end of ``x``'s buffer (in memory order) would load: the
    storage's next element, or ``fallback`` (arbitrary finite memory) where the allocation ends with ``x``.
    A test device for planted out-of-bounds readers."""
    end = x.storage_offset() + sum((s - 1) * st for s, st in zip(x.shape, x.stride())) + 1
    total = x.untyped_storage().nbytes() // x.element_size()
    if end < total:
        return x.detach().as_strided((total,), (1,), 0)[end].clone()
    return torch.tensor(fallback, dtype=x.dtype, device=x.device)

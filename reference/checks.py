"""Input checks every reference op makes before computing: dtypes that must agree, and finite inputs.

A kernel given a q/k/v dtype mix or a NaN computes something; the reference refuses, naming the argument, so a
mistake in the caller is never mistaken for a number to compare against.
"""

from __future__ import annotations

import torch

from .layouts import ReferenceInputError


def check_dtypes(q, k, v, beta, w) -> None:
    """q, k and v share one dtype (the io dtype); beta and w are in it or float32, as cuDNN takes them. Gates,
    states, a_log and dt_bias may each have their own floating dtype."""
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ReferenceInputError(f"{name}: dtype {x.dtype} differs from q's {q.dtype}; q, k and v must share "
                                      "one dtype")
    for name, x in (("beta", beta), ("w", w)):
        if x is not None and x.dtype not in (q.dtype, torch.float32):
            raise ReferenceInputError(f"{name}: dtype {x.dtype}; expected q's {q.dtype} or torch.float32")


def check_finite(tensors: dict) -> None:
    """Every element of every input tensor finite (only its own elements: a view's buffer may hold more)."""
    for name, x in tensors.items():
        if x is None:
            continue
        bad = ~torch.isfinite(x.detach())
        if bool(bad.any()):
            nan = int(torch.isnan(x.detach()).sum())
            raise ReferenceInputError(
                f"{name}: {nan} NaN and {int(bad.sum()) - nan} Inf values (first at index "
                f"{tuple(int(i) for i in bad.nonzero()[0])}); pass allow_nonfinite=True to compute with them")

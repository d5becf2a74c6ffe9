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


def check_devices(tensors: dict) -> None:
    """Every input tensor on q's device: a mix is refused by name here, not by torch's own error mid-way."""
    present = {name: x for name, x in tensors.items() if x is not None}
    first = next(iter(present), None)
    if first is None:
        return
    device = present[first].device
    for name, x in present.items():
        if x.device != device:
            raise ReferenceInputError(f"{name}: on device {x.device}, {first} on {device}; every input tensor must "
                                      "be on one device")


def check_linear_gate(g) -> None:
    """``gate_domain="linear"``: g holds the decay alpha itself, in [0, 1] (0 enters as log(0 + 1e-10), as cuDNN
    takes it). A negative alpha would make its log NaN and an alpha above 1 a growing state: both are a caller's
    mistake (a log-decay passed as linear), refused by name rather than computed."""
    gd = g.detach()
    bad = (gd < 0) | (gd > 1)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ReferenceInputError(
            f"g: gate_domain='linear' takes the decay alpha in [0, 1], but {int(bad.sum())} values are outside it "
            f"(min {float(gd.min()):.4g}, max {float(gd.max()):.4g}, first at index {first}); a log-decay "
            "(<= 0) goes with gate_domain='log'")

"""Input checks every reference op makes before computing: tensors and their shapes (against each other and the
op), the initial state's, dtypes that must agree, devices, finite inputs, a linear gate's range.

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


def check_tensor(name: str, x, *, ndim: int | None = None) -> None:
    """``x`` is a floating-point tensor (of ``ndim`` dims, when given)."""
    if not isinstance(x, torch.Tensor):
        raise ReferenceInputError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ReferenceInputError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ReferenceInputError(f"{name}: expected {ndim} dims, got shape {tuple(x.shape)}")


def check_shapes(spec, q, k, v, g, beta, w, *, safe_gate, a_log, dt_bias) -> tuple[int, int, int, int, int]:
    """The packed (thd) tensors against each other and the op (``spec``: which gates carry a key dim, whether there is
    a write gate): token counts, head counts and dims, the gates' shapes, a safe gate's a_log and dt_bias. Returns
    ``(T, H, K, HV, V)``; the output has ``HO = max(H, HV)`` heads."""
    T, H, K = q.shape
    if k.shape[0] != T or v.shape[0] != T:
        raise ReferenceInputError(f"k, v: token counts {k.shape[0]}, {v.shape[0]} do not match q's {T}")
    HK, HV, V = k.shape[1], v.shape[1], v.shape[2]
    if k.shape[2] != K:
        raise ReferenceInputError(f"k: head dim {k.shape[2]} does not match q's K={K}")
    if min(H, HK, HV, K, V) < 1:
        raise ReferenceInputError(f"q/k/v: head counts and dims must be >= 1, got H={H} HK={HK} HV={HV} K={K} V={V}")
    HO = max(H, HV)
    if HO % min(H, HV):
        raise ReferenceInputError(
            f"heads: the larger of H={H} (q) and HV={HV} (v) must be a multiple of the smaller"
        )
    if HK not in (H, HV):
        raise ReferenceInputError(f"k: head count HK={HK} must equal H={H} (q) or HV={HV} (v)")
    dims = {"": (), "K": (K,)}
    expect = {
        "g": ((T, HO, *dims[spec.g_feat]), "[T, HO" + (", K]" if spec.g_feat else "]")),
        "beta": ((T, HO, *dims[spec.beta_feat]), "[T, HO" + (", K]" if spec.beta_feat else "]")),
    }
    if spec.has_w:
        expect["w"] = ((T, HO, V), "[T, HO, V]")
    for name, (shape, symbolic) in expect.items():
        x = {"g": g, "beta": beta, "w": w}[name]
        if tuple(x.shape) != shape:
            raise ReferenceInputError(
                f"{name}: expected shape {symbolic}={list(shape)} (thd) for {spec.name}, got {list(x.shape)}"
            )
    if safe_gate:
        if a_log is not None:
            check_tensor("a_log", a_log)
            if tuple(a_log.shape) != (HO,):
                raise ReferenceInputError(f"a_log: expected shape [HO]=[{HO}], got {list(a_log.shape)}")
        if dt_bias is not None:
            check_tensor("dt_bias", dt_bias)
            want = (HO, *dims[spec.dt_bias_feat])
            if tuple(dt_bias.shape) != want:
                raise ReferenceInputError(f"dt_bias: expected shape {list(want)} for {spec.name}, got {list(dt_bias.shape)}")
    return T, H, K, HV, V


def check_initial_state(initial_state, key_major: tuple[int, int, int, int], state_layout: str) -> None:
    """An initial state, if given, is ``[N, HO, V, K]`` (``state_layout="vk"``, cuDNN's) or ``[N, HO, K, V]``."""
    if initial_state is None:
        return
    check_tensor("initial_state", initial_state)
    N, HO, K, V = key_major
    want = (N, HO, V, K) if state_layout == "vk" else (N, HO, K, V)
    if tuple(initial_state.shape) != want:
        raise ReferenceInputError(
            f"initial_state: expected shape {list(want)} ([N, HO, {'V, K' if state_layout == 'vk' else 'K, V'}],"
            f" state_layout={state_layout!r}), got {list(initial_state.shape)}"
        )

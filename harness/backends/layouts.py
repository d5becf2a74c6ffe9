"""The token layout and state orientation that FLA set and the libraries built on its convention share (FLA, vLLM's
FLA copy, FlashKDA, FlashQLA): ``[B, T, heads, *feat]`` tensors, thd as one batch row (B = 1) with ``cu_seqlens``,
and a key-major ``[N, HV, K, V]`` fp32 state. One place, so an adapter that converts the same way imports it
instead of another adapter's internals (docs/backends.md).

Libraries with another convention keep their own conversions: FlashInfer packs dense cases into thd
(``flashinfer/adapter.py``), jax-linear-attention turns equal-length thd into a batch (``jaxla/adapter.py``).
"""

from __future__ import annotations

import torch

from deltacheck.harness.judge.margins import with_margin


def to_btd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Case layout -> ``[B, T, heads, *feat]`` (thd: B = 1), contiguous between NaN margins (a transposed layout is
    copied into a margin-bearing buffer, harness/judge/margins.py)."""
    if layout == "thd":
        return with_margin(x.unsqueeze(0))
    if layout == "sbhd":
        x = x.transpose(0, 1)
    elif layout == "bhsd":
        x = x.transpose(1, 2)
    return with_margin(x)


def from_btd(o: torch.Tensor, layout: str) -> torch.Tensor:
    """``[B, T, HV, V]`` -> the case's layout (the inverse of ``to_btd``)."""
    if layout == "thd":
        return o.squeeze(0)
    if layout == "sbhd":
        return o.transpose(0, 1)
    if layout == "bhsd":
        return o.transpose(1, 2)
    return o


def state_to_key_major_fp32(state: torch.Tensor | None) -> torch.Tensor | None:
    """Our value-major ``[N, HO, V, K]`` initial state -> key-major fp32 ``[N, HV, K, V]`` between NaN margins (FLA
    asserts an fp32 state; FlashQLA takes what FLA hands it)."""
    if state is None:
        return None
    return with_margin(state.transpose(-1, -2), torch.float32)


def state_widened_to_fp32(state: torch.Tensor) -> torch.Tensor:
    """A key-major final state as the harness takes it: a bf16/fp16 one widened to fp32 (FLA already gives fp32)."""
    return state.float() if state.dtype in (torch.bfloat16, torch.float16) else state

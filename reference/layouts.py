"""Layout conversions among thd / bshd / sbhd / bhsd and between state orientations.

Every token-wise tensor is ``[tokens, heads, *features]`` in packed ``thd`` form; the dense layouts
only move the token and batch axes around the head axis:

=========  ==========================
``thd``    ``[T, H, *feat]`` + ``cu_seqlens [N+1]``
``bshd``   ``[N, L, H, *feat]``
``sbhd``   ``[L, N, H, *feat]``
``bhsd``   ``[N, H, L, *feat]``
=========  ==========================

Gates without a feature axis (GDN's ``g`` and ``beta``, KDA's ``beta``) follow the same rule with an
empty ``feat``. All conversions are pure views/reshapes, so round trips are bitwise.

State orientations: ``"vk"`` is cuDNN's value-major ``[N, HO, V, K]``; ``"kv"`` is key-major
``[N, HO, K, V]`` (FLA's ``[N, H, K, V]``, and the harness's canonical form).
"""

from __future__ import annotations

import torch

LAYOUTS = ("thd", "bshd", "sbhd", "bhsd")
STATE_LAYOUTS = ("vk", "kv")


class ReferenceInputError(ValueError):
    """Malformed input to a reference op; the message names the argument and what was expected."""


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ReferenceInputError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


def check_state_layout(state_layout: str) -> None:
    if state_layout not in STATE_LAYOUTS:
        raise ReferenceInputError(f"state_layout: expected one of {STATE_LAYOUTS}, got {state_layout!r}")


def dense_shape(x: torch.Tensor, layout: str, name: str = "x") -> tuple[int, int]:
    """(N, L) of a dense-layout tensor."""
    check_layout(layout)
    if layout == "thd":
        raise ReferenceInputError(f"{name}: dense_shape() needs a dense layout, got 'thd'")
    if x.dim() < 3:
        raise ReferenceInputError(
            f"{name}: a {layout} tensor needs at least 3 dims (batch, seq, heads), got shape {tuple(x.shape)}"
        )
    if layout == "bshd":
        return x.shape[0], x.shape[1]
    if layout == "sbhd":
        return x.shape[1], x.shape[0]
    return x.shape[0], x.shape[2]  # bhsd


def to_thd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Dense ``layout`` -> packed ``[N*L, H, *feat]`` (sequences back to back)."""
    check_layout(layout)
    if layout == "thd":
        return x
    if layout == "sbhd":
        x = x.transpose(0, 1)
    elif layout == "bhsd":
        x = x.transpose(1, 2)
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def from_thd(x: torch.Tensor, layout: str, n_seqs: int) -> torch.Tensor:
    """Packed ``[N*L, H, *feat]`` with N equal-length sequences -> dense ``layout``."""
    check_layout(layout)
    if layout == "thd":
        return x
    if n_seqs <= 0 or x.shape[0] % n_seqs:
        raise ReferenceInputError(
            f"from_thd: {x.shape[0]} tokens do not split into {n_seqs} equal-length sequences"
        )
    x = x.reshape(n_seqs, x.shape[0] // n_seqs, *x.shape[1:])
    if layout == "sbhd":
        return x.transpose(0, 1)
    if layout == "bhsd":
        return x.transpose(1, 2)
    return x


def convert(x: torch.Tensor, src: str, dst: str) -> torch.Tensor:
    """Between any two dense layouts (or to/from thd for one batch of equal lengths)."""
    if src == dst:
        check_layout(src)
        return x
    if src == "thd":
        raise ReferenceInputError("convert: from 'thd' needs the batch size; use from_thd(x, layout, n_seqs)")
    n_seqs, _ = dense_shape(x, src)
    return from_thd(to_thd(x, src), dst, n_seqs)


def dense_cu_seqlens(n_seqs: int, length: int, device=None) -> torch.Tensor:
    """cu_seqlens ``[0, L, 2L, ...]`` (int32, as cuDNN wants) for a dense batch packed to thd."""
    return torch.arange(n_seqs + 1, dtype=torch.int32, device=device) * length


def check_cu_seqlens(cu_seqlens: torch.Tensor, total_tokens: int) -> list[int]:
    """Validate ``cu_seqlens`` for ``total_tokens`` packed tokens; returns it as a list of ints."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ReferenceInputError(f"cu_seqlens: expected a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ReferenceInputError(f"cu_seqlens: expected an int32 or int64 tensor, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1:
        raise ReferenceInputError(f"cu_seqlens: expected a 1-D tensor [N+1], got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.numel() < 2:
        raise ReferenceInputError(
            f"cu_seqlens: expected at least 2 entries ([0, ..., T]), got {cu_seqlens.numel()}"
        )
    offsets = [int(v) for v in cu_seqlens.tolist()]
    if offsets[0] != 0:
        raise ReferenceInputError(f"cu_seqlens: must start at 0, starts at {offsets[0]}")
    for i in range(1, len(offsets)):
        if offsets[i] < offsets[i - 1]:
            raise ReferenceInputError(
                f"cu_seqlens: must be non-decreasing, entry {i} ({offsets[i]}) < entry {i - 1} ({offsets[i - 1]})"
            )
    if offsets[-1] != total_tokens:
        raise ReferenceInputError(
            f"cu_seqlens: last entry must equal the number of tokens ({total_tokens}), got {offsets[-1]}"
        )
    return offsets


def pack(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence ``[L_i, H, *feat]`` tensors -> (packed ``[sum L_i, H, *feat]``, int32 cu_seqlens)."""
    if not seqs:
        raise ReferenceInputError("pack: expected at least one sequence")
    lengths = [s.shape[0] for s in seqs]
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32, device=seqs[0].device)
    cu[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return torch.cat(seqs, dim=0), cu


def unpack(x: torch.Tensor, cu_seqlens: torch.Tensor) -> list[torch.Tensor]:
    """Packed thd -> list of per-sequence views."""
    offsets = check_cu_seqlens(cu_seqlens, x.shape[0])
    return [x[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def state_convert(state: torch.Tensor, src: str, dst: str) -> torch.Tensor:
    """Between value-major ``"vk"`` ``[N, HO, V, K]`` and key-major ``"kv"`` ``[N, HO, K, V]``."""
    check_state_layout(src)
    check_state_layout(dst)
    if state.dim() != 4:
        raise ReferenceInputError(f"state: expected 4 dims [N, HO, ., .], got shape {tuple(state.shape)}")
    return state if src == dst else state.transpose(-1, -2)

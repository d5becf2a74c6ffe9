"""State pools as serving stacks keep them: a library's null-slot convention (vLLM's null row 0, SGLang's -1 padding,
cuDNN's none), the index table checked against it, the rows a call writes, and the pool-integrity comparison
(addressed rows within a tolerance, every other row bitwise). Torch only; ``serving.py`` computes on these pools
(docs/serving.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layouts import ReferenceInputError

NULL_SLOT_KINDS = ("zero_index_is_null", "minus_one_is_padding")


@dataclass(frozen=True)
class NullSlot:
    """A library's null-slot convention, as data.

    ``"zero_index_is_null"`` (vLLM's FLA copy, ``NULL_BLOCK_ID = 0``): every id <= 0 is null; real rows are
    1 .. N_pool-1. ``"minus_one_is_padding"`` (SGLang): -1 is padding; real rows are 0 .. N_pool-1. ``None`` in
    place of a NullSlot (cuDNN): every index is a real row. A null sequence starts from a zero state and writes
    nothing to the pool.
    """

    kind: str

    def __post_init__(self):
        if self.kind not in NULL_SLOT_KINDS:
            raise ReferenceInputError(f"null_slot: kind must be one of {NULL_SLOT_KINDS}, got {self.kind!r}")

    def is_null(self, index: int) -> bool:
        return index <= 0 if self.kind == "zero_index_is_null" else index == -1

    def first_real(self) -> int:
        return 1 if self.kind == "zero_index_is_null" else 0


VLLM = NullSlot("zero_index_is_null")
SGLANG = NullSlot("minus_one_is_padding")
CUDNN = None


def is_null(null_slot, index: int) -> bool:
    """Whether ``index`` names no row under ``null_slot`` (None: cuDNN's convention, every index a row)."""
    return null_slot is not None and null_slot.is_null(index)


def check_state_indices(indices, n_pool: int, null_slot=None, *, name: str = "state_indices") -> list:
    """Validate an index table (any shape) against a pool of ``n_pool`` rows; returns it as nested lists of ints.

    Non-null entries lie in the convention's real range and are pairwise distinct: two sequences (or two tokens)
    naming one row make the row's final content depend on the write order, which no library defines."""
    if null_slot is not None and not isinstance(null_slot, NullSlot):
        raise ReferenceInputError(f"null_slot: expected a NullSlot or None, got {null_slot!r}")
    if not isinstance(indices, torch.Tensor) or indices.is_floating_point() or indices.is_complex() \
            or indices.dtype == torch.bool:
        raise ReferenceInputError(f"{name}: expected an integer torch.Tensor, got "
                                  f"{getattr(indices, 'dtype', type(indices).__name__)}")
    table = indices.tolist()
    lo = null_slot.first_real() if null_slot is not None else 0
    seen = {}
    flat = indices.reshape(-1).tolist()
    positions = [tuple(p) for p in torch.ones_like(indices).nonzero().tolist()]
    for pos, idx in zip(positions, flat):
        if is_null(null_slot, idx):
            continue
        if not lo <= idx < n_pool:
            conv = "no null slot (cuDNN)" if null_slot is None else f"null slot convention {null_slot.kind!r}"
            raise ReferenceInputError(
                f"{name}{list(pos)} = {idx}: out of range; a real row lies in [{lo}, {n_pool}) for a pool of "
                f"{n_pool} rows under {conv}")
        if idx in seen:
            raise ReferenceInputError(
                f"{name}{list(pos)} = {idx}: repeats {name}{list(seen[idx])}; one row addressed twice in one call is "
                "ambiguous (its final content would depend on the write order)")
        seen[idx] = pos
    return table


@dataclass(frozen=True)
class PoolComparison:
    """``addressed_err``: the largest ``|actual - expected| / (atol + rtol |expected|)`` over written rows (<= 1
    passes); ``changed_rows``: rows not written whose bits differ from the input pool; ``ok`` both hold."""

    addressed_err: float
    bad_rows: tuple
    changed_rows: tuple

    @property
    def ok(self) -> bool:
        return not self.bad_rows and not self.changed_rows


def compare_pool(actual, expected, before, written, *, atol: float, rtol: float) -> PoolComparison:
    """Compare a kernel's pool after a call (``actual``) with the reference's (``expected``): each row in
    ``written`` within ``atol + rtol |expected|`` elementwise; every other row bit-identical to ``before`` (the pool
    the kernel was given, same dtype as ``actual``)."""
    if actual.shape != expected.shape or actual.shape != before.shape:
        raise ReferenceInputError(f"compare_pool: shapes differ: actual {list(actual.shape)}, expected "
                                  f"{list(expected.shape)}, before {list(before.shape)}")
    written = sorted({int(i) for i in written})
    worst, bad = 0.0, []
    for r in written:
        e = expected[r].to(torch.float64)
        a = actual[r].to(torch.float64)
        ratio = ((a - e).abs() / (atol + rtol * e.abs()))
        ratio = torch.where(torch.isfinite(a), ratio, torch.full_like(ratio, float("inf")))
        m = float(ratio.max()) if ratio.numel() else 0.0
        worst = max(worst, m)
        if not m <= 1.0:
            bad.append(r)
    keep = [r for r in range(actual.shape[0]) if r not in set(written)]
    changed = [r for r in keep if not _bitwise_equal(actual[r], before[r])]
    return PoolComparison(worst, tuple(bad), tuple(changed))


def written_rows(state_indices, null_slot=None) -> list[int]:
    """The rows a ``pooled`` / ``spec_verify`` call writes: every non-null entry of the table."""
    flat = state_indices.reshape(-1).tolist()
    return [i for i in flat if not is_null(null_slot, i)]


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() in (1, 2, 4, 8):
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return bool(torch.equal(a.contiguous().view(view), b.contiguous().view(view)))
    return bool(torch.equal(a, b))

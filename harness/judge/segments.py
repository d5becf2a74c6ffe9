"""What a task hands a backend and gets back, as tensors: inputs inside NaN-margined buffers (``guarded``), the
continuation's segments of a case (``segment_inputs``, ``segment_case``) and the chained call over them
(``run_in_segments``), packing to thd, and run-to-run bitwise equality. The runner (``harness/judge/runner.py``) calls
these; they judge nothing."""

from __future__ import annotations

import math
from itertools import accumulate

import torch

from deltacheck.cases import Case
from deltacheck.reference import layouts

F64 = torch.float64

TOKENWISE = ("q", "k", "v", "g", "beta", "w")
SEQ_AXIS = {"bshd": 1, "sbhd": 0, "bhsd": 2}


def guarded(x: torch.Tensor | None, margin: int) -> torch.Tensor | None:
    """A copy of ``x`` living inside a buffer whose ``margin`` elements on each side are NaN."""
    if x is None or not x.is_floating_point() or margin == 0:
        return x
    buf = torch.full((x.numel() + 2 * margin,), math.nan, dtype=x.dtype, device=x.device)
    view = buf[margin : margin + x.numel()].view(x.shape)
    view.copy_(x)
    return view


def snapshot(inputs: dict) -> dict:
    """A bitwise copy of every input tensor's whole buffer, NaN margins included (``written``'s other half)."""
    bufs = {n: (x._base if x._base is not None else x) for n, x in inputs.items() if isinstance(x, torch.Tensor)}
    return {n: (b, b.detach().clone()) for n, b in bufs.items()}


def written(snap: dict) -> list[str]:
    """The inputs whose buffers changed since ``snapshot``: written in place, or past their ends into the margin."""
    changed = []
    for name, (buf, copy) in snap.items():
        if not bitwise_equal(buf, copy):
            changed.append(f"{name} ({int((_bits(buf) != _bits(copy)).sum())} elements)")
    return changed


def prefix_sums(lengths) -> list[int]:
    """``[0, l0, l0+l1, ...]``: sequence offsets, the shape of cu_seqlens."""
    return list(accumulate(lengths, initial=0))


def offsets_of(case: Case) -> list[int]:
    return prefix_sums(case.seqlens)


def to_packed(x: torch.Tensor, case: Case) -> torch.Tensor:
    return layouts.to_thd(x, case.layout)


def segment_inputs(case: Case, inputs: dict, seg: int) -> tuple[dict, list[int]]:
    """The ``seg``-th continuation segment of every sequence, as a smaller input dict of the same layout.

    Segments cut between real tokens: an input with several rows per token (GDP's k, v, beta: rows
    ``t*n .. t*n+n-1`` for token t) takes all n rows of each token in the segment, never part of them.
    """
    bounds = [case.segments(n)[seg] for n in case.seqlens]
    out = dict(inputs)
    if case.layout == "thd":
        offs = offsets_of(case)
        rows = [torch.arange(offs[i] + a, offs[i] + b) for i, (a, b) in enumerate(bounds)]
        idx = torch.cat(rows).to(inputs["q"].device)
        n = case.num_householder
        sub_idx = (idx.unsqueeze(1) * n + torch.arange(n, device=idx.device)).reshape(-1)
        for name in TOKENWISE:
            if inputs.get(name) is not None:
                rows_of = sub_idx if name in case.support.subtoken_inputs else idx
                out[name] = inputs[name].index_select(0, rows_of)
        lens = [b - a for a, b in bounds]
        out["cu_seqlens"] = torch.tensor(prefix_sums(lens), dtype=inputs["cu_seqlens"].dtype, device=inputs["cu_seqlens"].device)
    else:
        a, b = bounds[0]
        axis = SEQ_AXIS[case.layout]
        for name in TOKENWISE:
            if inputs.get(name) is not None:
                out[name] = inputs[name].narrow(axis, a, b - a)
        lens = [b - a] * case.N
    return out, lens


def segment_case(case: Case, lens: list[int]) -> Case:
    return case.replace(seqlens=tuple(lens), splits=())


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same bits, NaN payloads included (torch.equal says NaN != NaN, which is not what run-to-run means)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(_bits(a), _bits(b))


def _bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s bits as integers of its element size (NaN payloads compare as the bits they are)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    return x.detach().contiguous().view(ints)


def out_empty(inputs: dict, case: Case) -> torch.Tensor:
    return torch.zeros(0, case.HO, case.V, dtype=F64, device=inputs["q"].device)


def run_in_segments(case: Case, backend, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The continuation: ``case`` split at its points and run one segment after another, each segment starting from
    the state the previous one returned, carried as a framework stores it (value-major, in the case's state dtype).
    Returns the output packed to thd in token order (fp64) and the last final state, key-major fp64."""
    outs_by_seg = []
    state_vk = inputs.get("initial_state")
    state_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[case.state_dtype]
    n_seg = len(case.segments(case.seqlens[0]))
    seg_lens = []
    with torch.no_grad():
        for s in range(n_seg):
            seg, lens = segment_inputs(case, {n: (x.detach() if x is not None else None) for n, x in inputs.items()}, s)
            seg_lens.append(lens)
            if sum(lens) == 0:  # every sequence already ended: nothing to call, the state carries over
                outs_by_seg.append(out_empty(inputs, case))
                continue
            seg["initial_state"] = state_vk
            sub = segment_case(case, lens)
            o, st = backend.run(sub, seg)
            want = (case.N, case.HO, case.K, case.V)
            if tuple(st.shape) != want:
                raise ValueError(f"backend returned final_state of shape {list(st.shape)}; the contract is "
                                 f"float32 key-major [N, HO, K, V] = {list(want)}")
            outs_by_seg.append(to_packed(o, sub).to(F64))
            # Carry the state the way a framework stores it: value-major, in the state dtype.
            state_vk = layouts.state_convert(st.float(), "kv", "vk").to(state_dtype)
    # Re-interleave segments back into each sequence's token order.
    pieces = []
    seg_offsets = [prefix_sums(lens) for lens in seg_lens]
    for n in range(case.N):
        for s in range(n_seg):
            a, b = seg_offsets[s][n], seg_offsets[s][n + 1]
            pieces.append(outs_by_seg[s][a:b])
    if state_vk is None:  # no segment had a token and there was no initial state
        final = torch.zeros(case.N, case.HO, case.K, case.V, dtype=F64, device=inputs["q"].device)
    else:
        final = layouts.state_convert(state_vk, "vk", "kv").to(F64)
    return torch.cat(pieces), final

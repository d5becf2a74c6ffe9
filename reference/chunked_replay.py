"""Segments of the chunked reference replayed from a CUDA graph (``chunked_gdn2(graph_forward=..., graph_backward=...)``).

The chunked core works through the sequence in segments of whole chunks; every full-length segment runs the same
few hundred kernels on tensors of the same shapes. :class:`SegmentReplay` runs the first one eagerly on static
copies of its inputs, on the side stream a capture will use (the warm-up: cuBLAS's workspaces and the caching
allocator's blocks exist afterwards), captures the second from the same code on the same buffers, and, for it and
every later one, copies the inputs into those buffers and replays. The kernels and their inputs are the eager
segment's, so the result is the same bit for bit; what goes is the CPU's launch cost of each kernel, which at
small segments is larger than the GPU's time for it. Small segments are what lets one kernel's output still be
in the L2 cache when the next one reads it, so replay is what makes them pay.

Every replayer of a device uses one side stream and one memory pool, both kept for the process: the graph of each
call is captured into the pool the previous call's graph left, so a call allocates no new device memory (a
fresh pool would be a cudaMalloc per call, and its release a device-wide synchronisation), and only the first
segment ever run on the stream needs the eager warm-up (cuBLAS's workspace for the stream, made lazily, must
exist before a capture). The pool's blocks stay reserved by the process, as the caching allocator's do.

With ``KEEP_LAST`` the last graph of each kind (forward, backward) is kept with its static buffers, and a later
call whose segments have the same shapes and plan replays it without a capture: a repeated call launches nothing
from the CPU but the copies. Off by default: the kept buffers and the graph's working set stay allocated between
calls, and only repeated shapes gain (a benchmark's, not a suite of cases').

A capture that fails warns once, and every replayer of the process runs eagerly from then on.
"""

from __future__ import annotations

import warnings

import torch


class SegmentReplay:
    """``replayer(args)`` is ``run(args)`` for a list of tensors ``args`` of one shape per position: the first
    call eagerly (the warm-up), the later ones from one CUDA graph. A replay's outputs are the graph's own
    buffers, overwritten by the next replay: use (or copy) them before the next call."""

    disabled = False  # set for the process after a failed capture
    warmed: set = set()  # the side streams a segment has run on (their lazy state exists)
    kept: dict = {}  # what -> (key, static, replay): the last graph of each kind, with KEEP_LAST

    def __init__(self, run, what, key=None):
        self.run = run
        self.what = what  # "forward" / "backward": the warning's word, and the kind of graph kept
        self.key = key  # what, besides the inputs' shapes, fixes the kernels (None: never kept)
        self.static = None
        self.side = None
        self.replay = None
        self.failed = False

    @staticmethod
    def applies(x, n_full):
        """Whether replay can pay: CUDA, two full segments or more, no failed capture so far, and not inside a
        capture already (an outer graph replays every launch anyway, and graphs do not nest)."""
        return (x.is_cuda and n_full >= 2 and not SegmentReplay.disabled
                and not torch.cuda.is_current_stream_capturing())

    def __call__(self, args):
        if self.failed:
            return self.run(list(args))
        if self.static is None and KEEP_LAST and self.key is not None:
            self.key = (self.key, tuple((tuple(a.shape), a.dtype, a.device) for a in args))
            last = SegmentReplay.kept.get(self.what)
            if last is not None and last[0] == self.key:
                self.static, self.replay = last[1], last[2]
        if self.static is None:
            self.static = [torch.empty_like(a, memory_format=torch.contiguous_format) for a in args]
            for dst, src in zip(self.static, args):
                dst.copy_(src)
            self.side = side_stream(args[0].device)
            if self.side not in SegmentReplay.warmed:  # the stream's first segment: the warm-up
                SegmentReplay.warmed.add(self.side)
                return on_side_stream(self.side, lambda: self.run(self.static))
        if self.replay is None:
            SegmentReplay.kept.pop(self.what, None)  # its graph gone before the next is captured into the pool
            try:
                self.replay = capture(self.side, lambda: self.run(self.static), self.what)
            except Exception as e:  # noqa: BLE001 - eager is the same computation
                warnings.warn(f"chunked_gdn2: CUDA graph capture of the {self.what} failed "
                              f"({type(e).__name__}: {e}); running eagerly", stacklevel=3)
                SegmentReplay.disabled = True
                self.failed = True
                return self.run(list(args))
            if KEEP_LAST and self.key is not None:
                SegmentReplay.kept[self.what] = (self.key, self.static, self.replay)
        for dst, src in zip(self.static, args):
            dst.copy_(src)
        return self.replay()


KEEP_LAST = False
_SIDE_STREAMS: dict = {}
_POOLS: dict = {}


def new_stream():
    return torch.cuda.Stream()


def side_stream(device):
    """The side stream of ``device``'s replayers (one for the process)."""
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = new_stream()
    return _SIDE_STREAMS[device]


def _pool(key):
    """The memory pool of the graphs of ``key`` (a device and a kind), one for the process: no two graphs of a
    pool are alive at once, so none can overwrite another's buffers."""
    if key not in _POOLS:
        _POOLS[key] = torch.cuda.graph_pool_handle()
    return _POOLS[key]


def on_side_stream(side, fn):
    """``fn()`` on stream ``side``, ordered after the current stream's work and before its later work."""
    current = torch.cuda.current_stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        out = fn()
    current.wait_stream(side)
    for t in _tensors(out):
        t.record_stream(current)  # made on the side stream, used (and freed) on the current one
    return out


def capture(side, fn, kind=None):
    """``fn`` captured into a CUDA graph on stream ``side`` (where it has run once), into the pool of ``kind``: a
    callable that replays it on the current stream and returns the capture's outputs."""
    current = torch.cuda.current_stream()
    side.wait_stream(current)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(side):
            graph.capture_begin(pool=_pool((side.device, kind)), capture_error_mode="thread_local")
            try:
                captured = fn()
            finally:
                graph.capture_end()
    finally:
        current.wait_stream(side)

    def replay():
        graph.replay()
        return captured

    return replay


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for item in x:
            yield from _tensors(item)

"""Kernels, bytes moved and peak memory of a PyTorch computation, counted without running it.

Run the computation on the ``meta`` device (shapes and dtypes only, no data, no GPU needed) inside
:class:`OpCount`: every ATen op that reaches the dispatcher is seen once. Ops that only make views (or
allocate without writing) launch no kernel and are not counted. For the others:

- ``kernels``: one per op (what an eager GPU run launches, give or take a few internal helpers);
- ``bytes``: the bytes of every tensor argument and result (a view counts the elements it spans; a broadcast
  dimension counts once): a proxy for the memory traffic of an unfused, bandwidth-bound kernel;
- ``bytes_once``: ``bytes`` less the destinations it counts as read too: a tensor passed as ``out=`` and the
  destination of ``copy_`` are counted as an argument and as the result, though the kernel only writes them
  (an in-place op such as ``mul_`` or ``baddbmm_`` with beta 1 does read its destination: counted twice in both);
  closer to the traffic a GPU sees;
- ``peak``: the largest total of live storages created inside (inputs made before, and marked with
  :meth:`OpCount.exclude`, do not count), i.e. what ``torch.cuda.max_memory_allocated`` minus the memory
  before would report, up to the allocator's rounding.

This is how bench/chunked.py's ``--count`` compares launch counts and working sets at the GPU size on any
machine.
"""

from __future__ import annotations

import collections
import traceback
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ops that make a view or an uninitialised allocation: no kernel runs
_NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "view_as", "transpose", "t", "permute", "expand",
    "expand_as", "slice", "select", "unsqueeze", "squeeze", "as_strided", "alias", "diagonal", "unbind",
    "split", "split_with_sizes", "narrow", "detach", "unfold", "chunk", "movedim", "lift_fresh", "empty",
    "empty_like", "new_empty", "empty_strided", "new_empty_strided", "_conj", "conj", "resolve_conj",
    "resolve_neg", "is_same_size", "_has_compatible_shallow_copy_type", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "_local_scalar_dense", "set_",
}
# ops that allocate and write without reading their tensor argument
_WRITE_ONLY = {"new_zeros", "new_ones", "new_full", "zeros_like", "ones_like", "full_like", "fill_", "zero_"}
_MATMUL = {"bmm": (0, 1), "mm": (0, 1), "baddbmm": (1, 2), "baddbmm_": (1, 2), "addmm": (1, 2), "addmm_": (1, 2)}


def _spanned_bytes(t: torch.Tensor) -> int:
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size() if t.numel() else 0


def _tensors(xs):
    for x in xs:
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from _tensors(x)


def _site() -> str:
    """``file:line`` of the innermost frame in deltacheck's reference/ (else any frame outside torch)."""
    for f in reversed(traceback.extract_stack()):
        if "/reference/" in f.filename:
            return f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
    return "?"


class OpCount(TorchDispatchMode):
    """Counts kernels, bytes, flops and the peak of live storages (see the module docstring)."""

    def __init__(self, sites=False):
        super().__init__()
        self.bytes_once = 0
        # sites=True: bytes and kernels per (innermost deltacheck/reference/ frame, op), for a breakdown
        self.sites = collections.Counter() if sites else None
        self.site_kernels = collections.Counter()
        self.kernels = 0
        self.bytes = 0
        self.flops = 0
        self.by_op = collections.Counter()
        self.peak = 0
        self._live = {}  # storage id -> [bytes, live tensors]
        self._now = 0
        self._skip = set()

    def exclude(self, *tensors):
        """Storages made before the count (inputs): never counted as live."""
        for t in tensors:
            self._skip.add(t.untyped_storage()._cdata)
        return self

    def _track(self, t: torch.Tensor):
        key = t.untyped_storage()._cdata
        if key in self._skip:
            return
        entry = self._live.get(key)
        if entry is None:
            entry = self._live[key] = [t.untyped_storage().nbytes(), 0]
            self._now += entry[0]
            self.peak = max(self.peak, self._now)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key):
        entry = self._live.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                self._now -= entry[0]
                del self._live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        results = list(_tensors(out if isinstance(out, (tuple, list)) else (out,)))
        for t in results:
            self._track(t)
        if name in _NO_KERNEL:
            return out
        self.kernels += 1
        self.by_op[name] += 1
        read = [] if name in _WRITE_ONLY else list(_tensors(args)) + list(_tensors((kwargs or {}).values()))
        moved = sum(map(_spanned_bytes, read)) + sum(map(_spanned_bytes, results))
        self.bytes += moved
        dest = (kwargs or {}).get("out")
        if name == "copy_":
            dest = args[0]
        self.bytes_once += moved - (_spanned_bytes(dest) if isinstance(dest, torch.Tensor) else 0)
        if self.sites is not None:
            key = f"{_site()} {name}"
            self.sites[key] += moved
            self.site_kernels[key] += 1
        if name in _MATMUL:
            i, j = _MATMUL[name]
            self.flops += 2 * args[i].numel() * args[j].shape[-1]
        return out

    def summary(self) -> dict:
        return {"kernels": self.kernels, "bytes": self.bytes, "bytes_once": self.bytes_once, "flops": self.flops, "peak_bytes": self.peak,
                "top_ops": dict(self.by_op.most_common(8))}


def count_forward(fn, inputs, *args, **kwargs) -> dict:
    """Count ``fn(*inputs, *args, **kwargs)`` under ``torch.no_grad``; ``inputs`` are meta tensors."""
    with torch.no_grad(), OpCount().exclude(*inputs) as c:
        out = fn(*inputs, *args, **kwargs)
        del out
    return c.summary()


def count_forward_backward(fn, inputs, cotangents, *args, **kwargs) -> dict:
    """Count forward and backward of ``fn`` with every input a leaf; the peak includes the inputs' gradients."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    with OpCount().exclude(*leaves, *cotangents) as c:
        outs = fn(*leaves, *args, **kwargs)
        torch.autograd.backward(outs, cotangents)
        del outs
    summary = c.summary()
    summary["grad_bytes"] = sum(t.grad.nbytes for t in leaves if t.grad is not None)
    return summary


def main(argv=None) -> int:
    """The fp64 chunked forward's bytes per source line (CUDA forms) at the benchmark's size, largest first."""
    import argparse

    from deltacheck.reference import chunked_intra
    from deltacheck.reference.chunked import chunked_gdn2

    p = argparse.ArgumentParser(description=main.__doc__)
    for n, d in zip("NTHKV", (4, 4096, 16, 128, 128)):
        p.add_argument(f"--{n}", type=int, default=d)
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args(argv)
    shapes = [(a.N, a.T, a.H, a.K)] * 2 + [(a.N, a.T, a.H, a.V)] + [(a.N, a.T, a.H, a.K)] * 2
    shapes += [(a.N, a.T, a.H, a.V), (a.N, a.H, a.K, a.V)]
    meta = [torch.empty(*s, dtype=torch.float64, device="meta") for s in shapes]
    real, chunked_intra.cuda_shapes = chunked_intra.cuda_shapes, lambda x: True
    try:
        with torch.no_grad(), OpCount(sites=True).exclude(*meta) as c:
            out = chunked_gdn2(*meta, a.K**-0.5)
            del out
    finally:
        chunked_intra.cuda_shapes = real
    print(f"chunked fp64 forward, CUDA forms, N={a.N} T={a.T} H={a.H} K={a.K} V={a.V}: {c.kernels} kernels, "
          f"{c.bytes / 1e9:.2f} GB counted, {c.bytes_once / 1e9:.2f} GB with out=/copy_ destinations once")
    for key, b in c.sites.most_common(a.top):
        print(f"{b / 1e9:8.3f} GB {c.site_kernels[key]:4d} kernels  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""bench/opcount.py: what it counts per kernel (bytes, bytes_once) and its per-line breakdown of the forward."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch
from child_env import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
MB = 2**20  # one [512, 256] fp64 tensor is 1 MiB


def _opcount():
    spec = importlib.util.spec_from_file_location("_opcount_test", REPO / "bench" / "opcount.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _meta(n=3):
    return [torch.empty(512, 256, dtype=torch.float64, device="meta") for _ in range(n)]


def test_bytes_count_destinations_twice_bytes_once_does_not():
    """``bytes``: every argument and result, so an ``out=`` tensor and ``copy_``'s destination count twice;
    ``bytes_once`` counts them once (written only); an in-place op reads its destination and counts it twice in
    both. A view makes no kernel."""
    opcount = _opcount()
    a, b, c = _meta()
    cases = [
        (lambda: torch.mul(a, b, out=c), 4 * MB, 3 * MB),
        (lambda: c.mul_(a), 3 * MB, 3 * MB),
        (lambda: c.copy_(a), 3 * MB, 2 * MB),
        (lambda: a * b, 3 * MB, 3 * MB),
        (lambda: a.view(256, 512).t(), 0, 0),
    ]
    for fn, counted, once in cases:
        with opcount.OpCount().exclude(a, b, c) as n:
            fn()
        assert (n.bytes, n.bytes_once) == (counted, once)


def test_sites_add_up_to_the_total():
    """With ``sites=True`` every counted byte and kernel is attributed to a (line, op); ``python bench/opcount.py``
    prints that breakdown of the chunked forward, with the totals bench/chunked.py --count prints."""
    opcount = _opcount()
    a, b, c = _meta()
    with opcount.OpCount(sites=True).exclude(a, b, c) as n:
        torch.mul(a, b, out=c)
        (a + b).sum()
    assert sum(n.sites.values()) == n.bytes and sum(n.site_kernels.values()) == n.kernels == 3
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "opcount.py"), "--T", "512", "--top", "5"],
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    head, *rows = proc.stdout.splitlines()
    assert "chunked fp64 forward, CUDA forms, N=4 T=512" in head and "GB counted" in head
    assert len(rows) == 5 and all("chunked" in r and " GB " in r for r in rows), proc.stdout

"""CPU time of the chunked reference (fwd, fwd+bwd) on a small case set, medians; run with old or new PYTHONPATH."""
import statistics, sys, time, torch
import deltacheck
from deltacheck.reference.chunked import chunked_gdn2
torch.set_num_threads(1)
CASES = [(2, 21, 2, 8, 5), (1, 130, 2, 16, 16), (2, 300, 4, 32, 32), (1, 512, 2, 32, 32), (1, 1024, 4, 64, 64)]
def inputs(N, L, H, K, V):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    u = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)
    return [r(N,L,H,K), torch.nn.functional.normalize(r(N,L,H,K), dim=-1), r(N,L,H,V), -(u(N,L,H,K)*4.9+0.1), u(N,L,H,K), u(N,L,H,V), r(N,H,K,V)]
out = {}
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
for c in CASES:
    ins = inputs(*c)
    def fwd():
        with torch.no_grad(): chunked_gdn2(*ins, 0.5)
    leaves = [t.clone().requires_grad_() for t in ins]
    def fb():
        for t in leaves: t.grad = None
        o, s = chunked_gdn2(*leaves, 0.5); (o.sum() + s.sum()).backward()
    for name, fn in (("fwd", fwd), ("fwd+bwd", fb)):
        fn(); ts = []
        for _ in range(reps):
            t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
        out[f"{c} {name}"] = statistics.median(ts) * 1e3
print(deltacheck.__file__)
for k, v in out.items(): print(f"{k:<32} {v:9.2f} ms")

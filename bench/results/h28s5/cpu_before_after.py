import sys, time, statistics, torch
torch.set_num_threads(1)
from deltacheck.reference.chunked import chunked_gdn2
gen = torch.Generator().manual_seed(0)
def case(N,T,H,K,V):
    r=lambda *s: torch.randn(*s,generator=gen,dtype=torch.float64)
    u=lambda *s: torch.rand(*s,generator=gen,dtype=torch.float64)
    return [torch.nn.functional.normalize(r(N,T,H,K),dim=-1), torch.nn.functional.normalize(r(N,T,H,K),dim=-1), r(N,T,H,V), -(u(N,T,H,K)*4.9+0.1), u(N,T,H,K), u(N,T,H,V), r(N,H,K,V)]
out=[]
for sz in [(1,512,2,32,32),(2,256,2,16,16)]:
    x=case(*sz)
    def fwd():
        with torch.no_grad(): chunked_gdn2(*x,0.2)
    def fb():
        l=[t.clone().requires_grad_() for t in x]; o,s=chunked_gdn2(*l,0.2); (o.sum()+s.sum()).backward()
    for name,fn in (("fwd",fwd),("fwd+bwd",fb)):
        fn(); ts=[]
        for _ in range(9):
            t0=time.perf_counter(); fn(); ts.append(time.perf_counter()-t0)
        out.append(f"{sz} {name} {statistics.median(ts)*1e3:.2f}")
print(sys.argv[1], " | ".join(out))

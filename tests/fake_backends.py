"""Small third-party-style backends for the runner and required-mode tests (loaded as ``fake_backends:X``)."""

import os

import torch

from deltacheck.cases.envelope import Envelope
from deltacheck.harness.backends.base import Verdict, get_backend

ALL_OPS = frozenset({"gdn", "kda", "gdn2"})


class Working:
    """The fp64 oracle under another name: a backend that runs and passes everything."""

    name = "working"
    ops = ALL_OPS

    def check(self, case, env):
        return Verdict.ok()

    def run(self, case, inputs):
        return get_backend("oracle").run(case, inputs)


class Declining(Working):
    """An engine that declines every case, with its own reason."""

    name = "declining"

    def check(self, case, env):
        return Verdict.no("fake engine declined: head dim must be 256")


class Raising(Working):
    """A kernel that raises a Python exception on kda."""

    name = "raising"

    def run(self, case, inputs):
        if case.op == "kda":
            raise RuntimeError("illegal memory access (fake)")
        return super().run(case, inputs)


class Crashing(Working):
    """A kernel that takes the whole process down on kda, as a segfault would."""

    name = "crashing"

    def run(self, case, inputs):
        if case.op == "kda":
            os._exit(139)
        return super().run(case, inputs)


class NoBackward(Working):
    """Runs the forward, declines every case's backward (as cuDNN's Hopper KDA engine does on GQA)."""

    name = "nobackward"

    def check(self, case, env):
        return Verdict.ok(backward=False, backward_reason="fake engine: no backward for this configuration")


class Mute(Working):
    """Declines without saying why: the harness must not turn that into a silent skip."""

    name = "mute"

    def check(self, case, env):
        return Verdict(False, "")


class CrashingBackward(Working):
    """Forward fine, then the process dies in the backward, as a kernel fault in dK would."""

    name = "crashingbackward"

    def run(self, case, inputs):
        out, state = super().run(case, inputs)
        if case.backward and case.op == "gdn" and torch.is_grad_enabled():
            return _DieInBackward.apply(out), state
        return out, state


class _DieInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        os._exit(139)


HANG_MARKER_ENV = "DELTACHECK_TEST_HANG_MARKER"


class Hanging(Working):
    """A kernel that never returns on kda (a hung launch): the run can only end by being stopped."""

    name = "hanging"

    def run(self, case, inputs):
        if case.op == "kda":
            import os
            import time

            marker = os.environ.get(HANG_MARKER_ENV)
            if marker:  # tell a test's watchdog that the hang has begun (tests/test_runner.py)
                open(marker, "w").close()
            time.sleep(600)
        return super().run(case, inputs)


class InterruptToRuntimeError(Hanging):
    """Hangs on kda like ``Hanging``, but turns the KeyboardInterrupt that Ctrl-C or ``timeout -s INT`` raises inside
    it into a RuntimeError with no message, as tvm-ffi's callback boundary did to TileLang's nvcc compile on the H200
    (issue 25): the interrupt must not become a judged error."""

    name = "interrupt-to-runtime-error"

    def run(self, case, inputs):
        try:
            return super().run(case, inputs)
        except KeyboardInterrupt:
            raise RuntimeError() from None


class DecliningInside:
    """Declares an envelope (K = V = 64) but declines every case at run time: each decline is a disagreement."""

    name, ops = "declining-inside", frozenset({"kda"})
    envelope = Envelope("declining-inside kda", "kda", allowed={"dims": ("64x64",)})

    def envelopes(self, op, env=None, sm=None):
        return [self.envelope] if op == "kda" else []

    def check(self, case, env):
        return Verdict.no("engine refused (fake)") if case.K == 64 else Verdict.ok()

    def run(self, case, inputs):
        return get_backend("oracle").run(case, inputs)


class ZeroWriting(Working):
    """A kernel that writes zeros: output, final state and every gradient (the graph is kept, so gradients are
    zero tensors, not missing ones). It must fail at least one check of every generated case."""

    name = "zero-writing"

    def run(self, case, inputs):
        anchor = sum(x.sum() for x in inputs.values() if isinstance(x, torch.Tensor) and x.requires_grad)
        out, state = get_backend("oracle").run(case, {n: (x.detach() if isinstance(x, torch.Tensor) else x)
                                                      for n, x in inputs.items()})
        zero = 0.0 * anchor if torch.is_tensor(anchor) else 0.0
        return torch.zeros_like(out) + zero, torch.zeros_like(state) + zero


class Fp32Compute(Working):
    """A well-made kernel: it reads its bf16/fp16 inputs, computes in fp32 and stores its output in the io dtype
    (the state in fp32) — what a fused kernel does. The reference's chunked algorithm, at fp32."""

    name = "fp32-compute"
    gate_dtype = None  # a precision bug rounds the gate path to this dtype

    def run(self, case, inputs):
        from deltacheck import reference

        io = inputs["q"].dtype
        f32 = {n: (x.to(torch.float32) if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
               for n, x in inputs.items()}
        if self.gate_dtype is not None:
            f32["g"] = f32["g"].to(self.gate_dtype).to(torch.float32)
        args = [f32["q"], f32["k"], f32["v"], f32["g"], f32["beta"]] + ([f32["w"]] if case.op == "gdn2" else [])
        args.append(f32["cu_seqlens"] if case.layout == "thd" else None)
        kwargs = {**case.reference_kwargs(), "initial_state": f32.get("initial_state"), "a_log": f32.get("a_log"),
                  "dt_bias": f32.get("dt_bias"), "state_layout": "vk", "method": "chunked",
                  "compute_dtype": torch.float32}
        if case.beta_guard:
            kwargs["guard_dtype"] = io
        out, final_vk = getattr(reference, case.op)(*args, **kwargs)
        return out.to(io), final_vk.transpose(-1, -2)


def _bf16_chunk_cumsum(g: torch.Tensor, seqlens, chunk: int = 64) -> torch.Tensor:
    """The per-token log-decays a kernel would recover from a chunk-local cumulative sum kept in bf16: G_t is
    accumulated token by token in bf16 from each chunk's start, and g'_t = G_t - G_{t-1}. Packed [T, ...]."""
    out = torch.empty_like(g)
    start = 0
    for length in seqlens:
        for c0 in range(start, start + length, chunk):
            total = torch.zeros_like(g[0], dtype=torch.bfloat16)
            previous = torch.zeros_like(g[0])
            for t in range(c0, min(c0 + chunk, start + length)):
                total = (total.float() + g[t]).to(torch.bfloat16)
                out[t] = total.float() - previous
                previous = total.float()
        start += length
    return out


class Fp32ComputeBf16Gate(Fp32Compute):
    """The same kernel with one precision bug: the chunk-local cumulative sum of the log-decays accumulated in
    bf16 (log-domain gates; other gate domains are left alone)."""

    name = "fp32-compute-bf16-gate"

    def run(self, case, inputs):
        from deltacheck.reference import layouts

        if case.gate_domain == "log" and not case.safe_gate:
            g = layouts.to_thd(inputs["g"].float(), case.layout)
            g = _bf16_chunk_cumsum(g, case.seqlens)
            if case.layout != "thd":
                g = layouts.from_thd(g, case.layout, case.N)
            inputs = {**inputs, "g": g}
        return super().run(case, inputs)


class SteepGateBreaks:
    """Exact (the fp64 chunked reference) except where a log-decay is steeper than -7: then every output, state
    and gradient is NaN, as cuDNN FE 1.32's Hopper KDA engine at steep gates. Its gate frontier is -7 by
    construction. It serves kda and gdn2 with K = V = 64 only, so the frontier's base-case choice has to skip
    K = V = 128."""

    name = "steepgatebreaks"
    ops = frozenset({"kda", "gdn2"})
    BREAKS_BELOW = -7.0

    def check(self, case, env):
        if case.K != 64 or case.V != 64:
            return Verdict.no("fake engine: K = V = 64 only")
        return Verdict.ok()

    def run(self, case, inputs):
        out, state = get_backend("chunked").run(case, inputs)
        if bool((inputs["g"].detach() < self.BREAKS_BELOW).any()):
            return out * float("nan"), state * float("nan")
        return out, state


class _ScaledGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the incoming gradient by ``factor`` (a dropped chain factor)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.save_for_backward(factor)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        (factor,) = ctx.saved_tensors
        return grad * factor, None


class DroppedChainFactor(Working):
    """Right everywhere except d a_log, which misses the exp(a_log) factor of the sigmoid safe gate's chain rule
    (a KDA/GDN2 kernel that forgot d(exp(a_log))/d(a_log) = exp(a_log))."""

    name = "dropped-chain-factor"

    def run(self, case, inputs):
        a_log = inputs.get("a_log")
        if a_log is not None and a_log.requires_grad:
            inputs = {**inputs, "a_log": _ScaledGrad.apply(a_log, torch.exp(-a_log.detach()))}
        return get_backend("oracle").run(case, inputs)


class _NoisySigmoidGate(torch.autograd.Function):
    """KDA/GDN2's safe gate lb * sigmoid(exp(a_log) (g + dt_bias)) on packed [T, HO, K], whose backward returns a dg
    with relative noise and the d a_log / d dt_bias its own dg implies — as FLA's chunk_kda does (measured)."""

    @staticmethod
    def forward(ctx, g, a_log, dt_bias, lower_bound, noise):
        a = torch.exp(a_log)[None, :, None]
        s = torch.sigmoid(a * (g + dt_bias))
        ctx.save_for_backward(g, a_log, dt_bias, s)
        ctx.lower_bound, ctx.noise = lower_bound, noise
        return lower_bound * s

    @staticmethod
    def backward(ctx, grad):
        g, a_log, dt_bias, s = ctx.saved_tensors
        a = torch.exp(a_log)[None, :, None]
        dg = grad * ctx.lower_bound * s * (1 - s) * a
        generator = torch.Generator().manual_seed(7)
        dg = dg * (1 + torch.randn(dg.shape, generator=generator, dtype=dg.dtype) * ctx.noise)  # element-wise
        x = g + dt_bias
        return dg, (dg * x).sum(dim=(0, 2)), dg.sum(dim=0), None, None


class NoisyDgConsistentReduction(Working):
    """A KDA kernel (thd, sigmoid safe gate with a_log and dt_bias) whose dg carries ~6e-3 relative noise (FLA's
    measured dg error) and whose d a_log / d dt_bias are exactly the sums that dg implies."""

    name = "noisy-dg-consistent-reduction"
    NOISE = 6e-3

    def run(self, case, inputs):
        from deltacheck import reference

        assert case.op == "kda" and case.layout == "thd" and case.safe_gate and case.a_log and case.dt_bias
        g_eff = _NoisySigmoidGate.apply(inputs["g"].double(), inputs["a_log"].double(), inputs["dt_bias"].double(),
                                        case.support.gate_lower_bound, self.NOISE)
        f64 = {n: (x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x) for n, x in inputs.items()}
        kwargs = {**case.reference_kwargs(), "safe_gate": False, "initial_state": f64.get("initial_state"),
                  "state_layout": "vk"}
        kwargs.pop("gate_lower_bound", None)
        out, final_vk = reference.kda(f64["q"], f64["k"], f64["v"], g_eff, f64["beta"], f64["cu_seqlens"], **kwargs)
        return out, final_vk.transpose(-1, -2)


class ConstructorRaises(Working):
    """A backend that cannot be constructed here (its ``__init__`` raises), as one probing a driver would."""

    name = "constructorraises"

    def __init__(self):
        raise RuntimeError("no CUDA driver (fake)")


class LeaksAtExit(Working):
    """Prints, at its process's exit, nanobind's leak report (as cuDNN's extension does) and two other lines."""

    name = "leaksatexit"
    _registered = False

    def run(self, case, inputs):
        if os.environ.get("DELTACHECK_FAKE_LEAKS") and not LeaksAtExit._registered:
            import atexit

            from test_mistakes import LEAK_REPORT, OTHER_LINES

            text = "".join(line + "\n" for line in [*LEAK_REPORT[:4], OTHER_LINES[0], *LEAK_REPORT[4:], *OTHER_LINES[1:]])
            atexit.register(os.write, 2, text.encode())
            LeaksAtExit._registered = True
        return super().run(case, inputs)


class _Enveloped(Working):
    """Serves kda with K = V = 64 by its declared envelope (a third party's, written against the plug-in API)."""

    envelope = Envelope("fake kda K64", "kda", allowed={"dims": ("64x64",)})

    def envelopes(self, op, env=None, sm=None):
        return [self.envelope] if op == "kda" else []


class DeclinesOutsideItsEnvelope(_Enveloped):
    """Declines what its envelope says it does not serve, and runs (and passes) the rest."""

    name = "declines-outside"

    def check(self, case, env):
        return Verdict.ok() if case.K == 64 and case.V == 64 else Verdict.no("fake engine: K = V = 64 only")


class DeclinesInsideItsEnvelope(_Enveloped):
    """Declines cases its envelope says it serves (every case with GQA-free heads of 2): it refuses what it is
    documented to serve."""

    name = "declines-inside"

    def check(self, case, env):
        if case.K != 64 or case.V != 64:
            return Verdict.no("fake engine: K = V = 64 only")
        return Verdict.no("fake engine: refused (a regression)") if case.H == 2 else Verdict.ok()


class NaNOnOneCase(Working):
    """Right everywhere except one case (the one whose id sorts first among those it sees), where it is all NaN."""

    name = "nan-on-one"
    BAD = "kda-bf16-thd-N3-T[0_1_127]"

    def run(self, case, inputs):
        out, state = super().run(case, inputs)
        return (out * float("nan"), state) if case.id.startswith(self.BAD) else (out, state)


class TinyState(Working):
    """The oracle's output, and a final state of negligible size that depends on the call (1e-46 per token): the
    chained state differs from the single call's by rel RMS ~1, both far below FLA's 1e-6 absolute rule."""

    name = "tiny-state"

    def run(self, case, inputs):
        out, state = super().run(case, inputs)
        return out, torch.full_like(state, 1e-46 * case.total_tokens)


class ReportsThreads(Working):
    """Declines every case, saying how many torch threads the process that judged it uses (tests/test_runner.py)."""

    name = "reports-threads"

    def check(self, case, env):
        return Verdict.no(f"torch threads in this process: {torch.get_num_threads()}")


class Noting(Working):
    """Runs as the oracle, noting a conversion in its verdict as the docs ask adapters to (tests/test_reports.py)."""

    name = "noting-kernel"

    def check(self, case, env):
        return Verdict.ok("beta cast fp32 -> bf16, as the op demands (fake)")


class DropsBetaGuard(Working):
    """A wrapper that forgets to pass beta_guard on (the reference without the guard): tests/test_mutants.py."""

    name = "drops-beta-guard"

    def run(self, case, inputs):
        return get_backend("oracle").run(case.replace(beta_guard=False), inputs)


class SteepGateCrashes(SteepGateBreaks):
    """SteepGateBreaks whose process dies (``os._exit``, as a CUDA illegal address ends one) on the gate point -4:
    through the pool the frontier loses that point, not the search."""

    name = "steepgatecrashes"

    def run(self, case, inputs):
        if case.gate == "unif4":
            os._exit(3)
        return super().run(case, inputs)


class FloorCounting:
    """The exact chunked reference with floors that count how often they are asked (``FloorCounting.asked``, per
    op): a run computes each pair's availability once and hands it to every task."""

    name = "floorcounting"
    ops = frozenset({"gdn", "kda", "gdn2"})
    asked: dict = {}

    def pair_verdict(self, op, env):
        FloorCounting.asked[op] = FloorCounting.asked.get(op, 0) + 1
        return Verdict.ok()

    def check(self, case, env):
        return Verdict.ok()

    def run(self, case, inputs):
        return get_backend("chunked").run(case, inputs)


class NarrowEnvelope(Working):
    """A third party's backend declaring a narrow envelope (gdn2, fp16, bhsd, K x V = 64 x 128, zero gate) through the plug-in
    API's ``envelopes`` hook: the generated tier gets cases inside it, as the built-ins' envelopes get theirs."""

    name = "narrow-envelope"
    envelope = Envelope("narrow gdn2 fp16 bhsd 64x128 zero", "gdn2",
                        allowed={"io_dtype": ("fp16",), "layout": ("bhsd",), "dims": ("64x128",), "gate": ("zero",)})

    def envelopes(self, op, env=None, sm=None):
        return [self.envelope] if op == "gdn2" else []


class OldStyle:
    """A plug-in written against the API before issue 23: the four protocol members, a ``version_key`` the probe
    does not know, a ``load`` and a ``pair_verdict(op, env)`` — every hook found by name, as before."""

    name = "old-style"
    ops = frozenset({"kda"})
    version_key = "old_style_lib"
    loads = 0

    def pair_verdict(self, op, env):
        return Verdict.ok()

    def load(self, op):
        OldStyle.loads += 1
        return Verdict.ok()

    def check(self, case, env):
        return Verdict.ok()

    def run(self, case, inputs):
        return get_backend("oracle").run(case, inputs)


class RefusesOneCase(Working):
    """Right everywhere except one case, where the library raises (refuses a valid input), as FlashQLA 0.1.3 does
    on a packed batch holding an empty sequence."""

    name = "refuses-one"
    BAD = NaNOnOneCase.BAD

    def run(self, case, inputs):
        if case.id.startswith(self.BAD):
            raise ValueError("invalid sequence lengths: [0, 1, 3] (fake)")
        return super().run(case, inputs)


def FlashQlaOnItsDouble():  # noqa: N802 - loaded as fake_backends:FlashQlaOnItsDouble, called like a class
    """The real ``flashqla`` adapter over the flash-qla 0.1.3 contract double (tests/doubles/flash_qla.py)."""
    from doubles import flash_qla

    from deltacheck.harness.backends.flashqla.adapter import FlashQlaBackend

    return FlashQlaBackend(flash_qla.make())


def FlaDispatchOnItsDouble():  # noqa: N802 - as above
    """The real ``fla-dispatch`` adapter over the FLA 0.6 dispatch double (FlashQLA installed)."""
    from doubles import fla_dispatch

    from deltacheck.harness.backends.fla.dispatch import FlaDispatchBackend

    ops, backends = fla_dispatch.make()
    return FlaDispatchBackend(ops, backends_module=backends)

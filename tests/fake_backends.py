"""Small third-party-style backends for the runner and required-mode tests (loaded as ``fake_backends:X``)."""

import os

import torch

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


class Hanging(Working):
    """A kernel that never returns on kda (a hung launch): the run can only end by being stopped."""

    name = "hanging"

    def run(self, case, inputs):
        if case.op == "kda":
            import time

            time.sleep(600)
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

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

"""nanobind's reference-leak report, kept out of the user's terminal and nothing else with it.

cuDNN frontend's extension (``cudnn._compiled_module``) is built with nanobind, which prints pages of
``nanobind: leaked N instances!`` / `` - leaked instance 0x... of type "..."`` lines when a process that imported
it exits with objects still alive — every run worker and every pytest process does. The wheel (1.32.0) does
not expose nanobind's ``set_leak_warnings`` to Python, so the lines are filtered out of the stream instead:
exactly the lines of a leak report, in a report (a header line, then its items and its two closing lines);
every other line passes unchanged, byte for byte.

Two places use it. ``pool`` reads each run worker's stderr through ``LeakFilter`` in the parent. A pytest
process (``pytest_plugin``) cannot be read by a parent of ours, and nanobind prints after the interpreter has
finalized (``Py_AtExit``), when no Python code of the process runs any more: ``filter_at_exit`` hands the
process's stderr, from its last ``atexit`` handler on, to a small filtering process (this file run as a script,
standard library only) that writes every other line to the original stderr.
"""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import sys

_HEADER = re.compile(rb"nanobind: leaked \d+ (?:instances|types|functions|keep_alive records)!\r?\n?")
_ITEM = re.compile(rb' - (?:leaked (?:instance (?:0x)?[0-9a-fA-F]+ of type|type|function) ".*"'
                   rb"|\.\.\. skipped remainder)\r?\n?")
_CAUSE = b"nanobind: this is likely caused by a reference counting issue in the binding code."
_SEE = b"See https://nanobind.readthedocs.io/en/latest/refleaks.html"


class LeakFilter:
    """Line by line: ``keep(line)`` is False only for the lines of a nanobind leak report."""

    def __init__(self) -> None:
        self.in_report = False

    def keep(self, line: bytes) -> bool:
        if _HEADER.fullmatch(line):
            self.in_report = True
            return False
        if self.in_report:
            bare = line.rstrip(b"\r\n")
            if bare == _SEE:  # the report's last line
                self.in_report = False
                return False
            if bare == _CAUSE or _ITEM.fullmatch(line):
                return False
        self.in_report = False
        return True


def nanobind_loaded() -> bool:
    """Whether this process holds a nanobind extension (whose functions are of type ``nanobind.nb_func``)."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if not path.endswith((".so", ".pyd")):
            continue
        for value in list(vars(module).values()):
            if type(value).__module__ == "nanobind":
                return True
    return False


def filter_at_exit() -> None:
    """From this process's last ``atexit`` handler on, its stderr (fd 2) goes through ``LeakFilter`` in a
    child process that writes every other line to the original stderr — only when a nanobind extension is
    loaded then. Registered once per process; ``atexit`` runs handlers last-registered first, and nanobind
    prints after every one of them."""
    global _registered
    if not _registered:
        atexit.register(_hand_stderr_to_filter)
        _registered = True


_registered = False


def _hand_stderr_to_filter() -> None:
    if not nanobind_loaded():
        return
    try:
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        # -I -S: the standard library only, nothing of this process's environment or site packages. The child
        # forks the filter off and exits at once, so it is waited for here and no process is left unreaped.
        subprocess.run([sys.executable, "-I", "-S", os.path.abspath(__file__)], stdin=read_end,
                       stdout=subprocess.DEVNULL, close_fds=True, check=False, timeout=30)
        os.close(read_end)
        os.dup2(write_end, 2)
        os.close(write_end)
    except (OSError, subprocess.SubprocessError):
        pass  # no filter: the report reaches the terminal, as it did before, and nothing else is lost


def _filter_stdin_to_stderr() -> None:
    import signal

    if hasattr(os, "fork") and os.fork() > 0:
        os._exit(0)  # the process that started us waits for this one; the filter goes on in the fork
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a late Ctrl-C must not cut the lines still coming
    leak_filter = LeakFilter()
    out = sys.stderr.buffer
    for line in sys.stdin.buffer:
        if leak_filter.keep(line):
            out.write(line)
            out.flush()


if __name__ == "__main__":
    _filter_stdin_to_stderr()

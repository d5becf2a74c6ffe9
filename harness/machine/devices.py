"""The devices this process can use: the GPUs visible to it (``visible_gpus``, for pinning workers) and why a
requested torch device cannot run here (``device_problem``, the CLI's and the pytest plugin's check)."""

from __future__ import annotations

import os
import subprocess


def visible_gpus(environ=os.environ, run=subprocess.run) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries, without initializing CUDA here
    (a process that has touched CUDA can no longer be pinned to one GPU, and its children inherit that).

    An explicit ``CUDA_VISIBLE_DEVICES`` is the answer (``""`` hides every GPU); otherwise
    ``nvidia-smi -L`` counts them. No nvidia-smi: no GPUs."""
    pinned = environ.get("CUDA_VISIBLE_DEVICES")
    if pinned is not None:
        return [d.strip() for d in pinned.split(",") if d.strip()]
    try:
        out = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i in range(sum(1 for line in out.splitlines() if line.startswith("GPU ")))]


def device_problem(device: str, flag: str = "--device") -> str | None:
    """Why the torch device ``device`` (given as ``flag``) cannot run here: a usage error naming what is available,
    or None. `deltacheck run` and the pytest plugin (``--dc-device``) ask the same question."""
    import torch

    available = ["cpu"]
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        available += ["cuda"] + [f"cuda:{i}" for i in range(n)]
    listed = f"available here: {', '.join(available)}"
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        return f"{flag} {device}: not a torch device; {listed}"
    if parsed.type == "cpu":
        return None
    if parsed.type != "cuda":
        return f"{flag} {device}: deltacheck runs on cpu or cuda; {listed}"
    if not torch.cuda.is_available():
        return f"{flag} {device}: this machine has no CUDA device torch can use; {listed}"
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        return f"{flag} {device}: this machine has {torch.cuda.device_count()} CUDA device(s); {listed}"
    return None

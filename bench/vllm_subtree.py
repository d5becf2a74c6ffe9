"""Build the vLLM subtree a GPU test machine needs to run vLLM's bundled FLA copy and its FlashKDA op.

A TEST-ENVIRONMENT TOOL, never part of the product: the adapters (harness/backends/vllm_fla/, flashkda/) import
whatever vLLM is installed. On a machine where a full vLLM install is impossible (the H200 test machine: no
network, 64 MiB carried per call; vLLM 0.33's wheel is 336 MB and pins torch 2.14), this writes a directory
that can go first on PYTHONPATH:

- copied verbatim from a vllm wheel (never edited): ``vllm/third_party/flash_linear_attention/**``, the pure
  modules it imports (``triton_utils``, ``envs``, ``logger``, ``logging_utils``, ``utils/{math,platform,torch,
  gpu_sync_debug,...}``, ``model_executor/warmup/jit_warmup*``), ``version.py``, ``_flashkda_C.abi3.so`` and the
  dist-info METADATA (so ``importlib.metadata.version('vllm')`` reads the wheel's version);
- three SHIMS, each headed "TEST-ENVIRONMENT SHIM" (docs/libraries.md, "vLLM's FLA copy: the test machine"):
  ``vllm/__init__.py`` (the version only: the real one also runs ``env_override``, which edits LD_LIBRARY_PATH
  for CUDA forward compatibility), ``vllm/platforms/__init__.py`` (``current_platform`` as a CUDA platform
  answering the questions the copied modules ask; the real one resolves ``vllm.platforms.cuda``, which loads
  the 92 MB ``_C_stable_libtorch`` extension), ``vllm/model_executor/__init__.py`` (empty: the real one imports
  the engine's weight loaders and ``vllm.distributed``, i.e. pyzmq and the engine).

    python3 bench/vllm_subtree.py WHEEL OUT_DIR        # prints what it copied and shimmed
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

# Copied verbatim: the FLA copy and what its module-level imports reach once the three shims cut the engine off
# (found by following the module-level imports of ops/__init__.py, chunk.py and fused_recurrent.py).
COPIED_PREFIXES = ("vllm/third_party/flash_linear_attention/", "vllm/triton_utils/", "vllm/logging_utils/")
COPIED_FILES = (
    "vllm/third_party/__init__.py", "vllm/version.py", "vllm/_version.py", "vllm/envs.py", "vllm/logger.py",
    "vllm/utils/__init__.py", "vllm/utils/math_utils.py", "vllm/utils/platform_utils.py",
    "vllm/utils/gpu_sync_debug.py", "vllm/utils/torch_utils.py", "vllm/utils/torch_version.py",
    "vllm/utils/import_utils.py", "vllm/utils/system_utils.py",
    "vllm/model_executor/warmup/__init__.py", "vllm/model_executor/warmup/jit_warmup.py",
    "vllm/model_executor/warmup/jit_warmup_triton_helper.py", "vllm/_flashkda_C.abi3.so",
)
SKIPPED = ("vllm/logging_utils/dump_input.py",)  # imports the engine's config and scheduler; nothing imports it here

_HEADER = ('"""TEST-ENVIRONMENT SHIM written by deltacheck bench/vllm_subtree.py, not vLLM\'s file. It stands in for\n'
           "{what} so vLLM's bundled FLA copy imports without the engine on a test machine; a real vLLM install\n"
           'never uses it (docs/libraries.md)."""\n')

SHIMS = {
    "vllm/__init__.py": _HEADER.format(what="vllm/__init__.py (which also runs env_override)")
    + "from .version import __version__, __version_tuple__  # noqa: F401\n",
    "vllm/model_executor/__init__.py": _HEADER.format(
        what="vllm/model_executor/__init__.py (which imports the engine's parameter and distributed modules)"),
    "vllm/platforms/__init__.py": _HEADER.format(
        what="vllm/platforms/__init__.py (whose CUDA platform loads the 92 MB _C_stable_libtorch extension)")
    + '''
from collections import namedtuple
from importlib.metadata import version as _version

import torch

DeviceCapability = namedtuple("DeviceCapability", "major minor")


def vllm_version_matches_substr(substr: str) -> bool:
    return substr in _version("vllm")


class _CudaPlatform:
    """The answers vLLM's CudaPlatform gives (vllm/platforms/cuda.py, interface.py), read from torch."""

    device_name = device_type = "cuda"
    dispatch_key = "CUDA"

    def is_cuda(self): return True
    def is_cuda_alike(self): return True
    def is_rocm(self): return False
    def is_xpu(self): return False
    def is_cpu(self): return False
    def is_tpu(self): return False
    def is_out_of_tree(self): return False
    def is_pin_memory_available(self): return True
    def log_warnings(self): return None
    def current_stream(self): return torch.cuda.current_stream()
    def manual_seed_all(self, seed): torch.cuda.manual_seed_all(seed)
    def get_device_name(self, device_id=0): return torch.cuda.get_device_name(device_id)
    def num_compute_units(self, device_id=0): return torch.cuda.get_device_properties(device_id).multi_processor_count

    def get_device_capability(self, device_id=0):
        return DeviceCapability(*torch.cuda.get_device_capability(device_id))

    def has_device_capability(self, capability, device_id=0):
        c = self.get_device_capability(device_id)
        value = c.major * 10 + c.minor
        return value >= (capability if isinstance(capability, int) else capability[0] * 10 + capability[1])

    def is_device_capability_family(self, capability, device_id=0):
        c = self.get_device_capability(device_id)  # interface.py: to_int() // 10 == capability // 10
        return (c.major * 10 + c.minor) // 10 == capability // 10

    def is_arch_support_pdl(self):  # cuda.py: major >= 9
        return torch.cuda.get_device_capability()[0] >= 9

    def __getattr__(self, name):
        raise AttributeError(f"the test-environment shim of vllm.platforms does not answer {name!r}: add it "
                             "(bench/vllm_subtree.py) from vllm/platforms/cuda.py")


current_platform = _CudaPlatform()
''',
}


def build(wheel: Path, out: Path) -> list[str]:
    done = []
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        wanted = [n for n in names if (n.startswith(COPIED_PREFIXES) or n in COPIED_FILES) and n not in SKIPPED
                  and not n.endswith("/")]
        missing = sorted(set(COPIED_FILES) - set(names))
        if missing:
            raise SystemExit(f"{wheel.name} lacks {missing}")
        for name in wanted + [meta]:
            target = out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(name))
            done.append(f"copied {name}")
    for name, text in SHIMS.items():
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        done.append(f"SHIM   {name}")
    return done


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print("\n".join(build(Path(sys.argv[1]), Path(sys.argv[2]))))

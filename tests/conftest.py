import os

import torch

pytest_plugins = ["deltacheck.harness.pytest_plugin"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per xdist worker: the CI machine has 2 cores and runs 2 workers.
    torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption("--dc-exhaustive", action="store_true",
                     help="also run the checks over every case of L1 and L2 (tens of minutes on a CPU)")

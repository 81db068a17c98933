"""One thread per worker process, for every thread pool it may use.

Worker processes that run side by side on a small CPU (the batch runner's runs, the client
processes of one run) each get one intra-op thread: two single-threaded processes on two
cores do more work than one process with two threads, and pools left at one thread per core
oversubscribe the CPU when processes share it.
"""

from __future__ import annotations

import os

import torch
from threadpoolctl import threadpool_limits


def worker_threads(threads: int) -> None:
    """Give this worker process ``threads`` threads, in torch and in the BLAS / OpenMP pools
    of NumPy, SciPy and scikit-learn too. Left at one thread per core, those pools
    oversubscribe the CPU when workers run side by side (AlignFed's anchor loop:
    ``python benchmarks/bench.py --part workers``)."""
    torch.set_num_threads(threads)
    threadpool_limits(threads)  # the pools loaded by now (NumPy's, torch's)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)  # and those loaded later (SciPy's, scikit-learn's)


def single_thread_worker() -> None:
    """Initialiser of worker processes: one thread each."""
    worker_threads(1)

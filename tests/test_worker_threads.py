"""The batch runner's worker processes use one thread in every pool, not only torch's."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from fedtsp.core.threads import single_thread_worker


def _thread_counts() -> dict[str, int]:
    """In a worker: each thread pool's size, after loading what the runs load lazily."""
    import scipy.linalg  # noqa: F401  (SciPy's own OpenBLAS)
    import sklearn.cluster  # noqa: F401  (scikit-learn's OpenMP)
    import torch
    from threadpoolctl import threadpool_info

    counts = {f"{p['internal_api']}:{p['filepath']}": p["num_threads"] for p in threadpool_info()}
    return counts | {"torch": torch.get_num_threads()}


def test_worker_processes_run_every_thread_pool_on_one_thread():
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=single_thread_worker) as pool:
        counts = pool.submit(_thread_counts).result()
    assert any(k.startswith("openblas:") for k in counts), counts  # NumPy's / SciPy's BLAS
    assert any(k.startswith("openmp:") for k in counts), counts
    assert set(counts.values()) == {1}, counts

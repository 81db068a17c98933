"""The FMCL benchmark: clustered-FL methods (`fedtsp.algorithms`: fmcl, pacfl, ifca, cfl,
clusters) on populations with planted client groups (`fedtsp.data.populations`), planned
and stored like every other experiment."""

from fedtsp.paper.fmcl.benchmark import (
    METHODS,
    POPULATIONS,
    benchmark_row,
    benchmark_specs,
    benchmark_table,
    is_benchmark_record,
    run_benchmark,
    summarize_benchmark,
)

__all__ = [
    "METHODS",
    "POPULATIONS",
    "benchmark_row",
    "benchmark_table",
    "benchmark_specs",
    "is_benchmark_record",
    "run_benchmark",
    "summarize_benchmark",
]

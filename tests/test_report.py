"""Tables from run records: the numbers are the records' numbers, aggregated over seeds."""

from __future__ import annotations

import numpy as np
from conftest import tiny_config

from fedtsp.core.results import RunStore
from fedtsp.engine.simulation import run_experiment
from fedtsp.paper.report import fmcl_table, runs_frame, summary_table
from fedtsp.paper.tables import to_markdown


def test_summary_table_means_over_seeds(tmp_path, tiny_data):
    records = [
        run_experiment(
            tiny_config(rounds=1, seed=s), dataset=tiny_data, out=tmp_path, progress=False
        )
        for s in (0, 1)
    ]
    frame = runs_frame(RunStore(tmp_path).records())
    assert len(frame) == 2
    table = summary_table(frame, ["algorithm"])
    accs = np.array([r["summary"]["best_acc"] for r in records]) * 100
    assert table.loc[0, "best-round acc (%)"] == f"{accs.mean():.2f} ± {accs.std(ddof=1):.2f}"
    assert table.loc[0, "seeds"] == "0,1"
    text = to_markdown(table)
    assert text.splitlines()[0].startswith("| algorithm | seeds |")
    assert len(text.splitlines()) == 3


def _fmcl_record(method: str, seed: int, best: float, found: list[int]) -> dict:
    """A population run's record, as the engine writes it (only the fields the rows read)."""
    algorithm, options = {"fmcl": ("fmcl", {}), "ifca": ("ifca", {"num_clusters": 2})}[method]
    timings = {"upload": 0.05, "server": 0.05}
    return {
        "kind": "federated",
        "status": "complete",
        "key": f"{method}{seed}",
        "config": {
            "population": "label-groups",
            "algorithm": algorithm,
            "algo_options": options,
            "seed": seed,
            "num_clients": 4,
            "rounds": 2,
        },
        "partition": {"groups": [0, 0, 1, 1]},
        "server": {"assignment": found},
        "history": [
            {
                "client_acc": [best] * 4,
                "bytes_up_per_client": 5.0,
                "bytes_down_per_client": 5.0,
                "timings": timings,
            },
            {"client_acc": [best] * 4, "timings": timings},
        ],
        "summary": {"best_acc": best, "final_acc": best, "converged": False},
        "timings": {"rounds_wall": 1.0},
    }


def test_a_store_with_fmcl_records_gives_both_tables(tmp_path, tiny_data):
    run_experiment(tiny_config(rounds=1), dataset=tiny_data, out=tmp_path, progress=False)
    fmcl = [
        _fmcl_record("ifca", 0, 0.40, [0, 1, 1, 1]),
        _fmcl_record("fmcl", 0, 0.50, [0, 0, 1, 1]),
        _fmcl_record("fmcl", 1, 0.52, [0, 0, 1, 1]),
    ]
    records = [*RunStore(tmp_path).records(), *fmcl]
    assert list(runs_frame(records)["algorithm"]) == ["local"]  # FMCL records left out
    table = fmcl_table(records)
    assert list(table["method"]) == ["fmcl", "ifca"]  # in the benchmark's method order
    assert table.loc[0, "best acc (%)"].startswith("51.00 ± ")  # mean over the two seeds
    assert table.loc[0, "ARI"] == "1.000 (n = 2, all equal)"
    assert table.loc[1, "best acc (%)"] == "40.00 (n = 1)"

"""Tables from run records: the numbers are the records' numbers, aggregated over seeds."""

from __future__ import annotations

import numpy as np
from conftest import tiny_config

from fedtsp.report import fmcl_table, runs_frame, summary_table
from fedtsp.results import RunStore
from fedtsp.simulation import run_experiment
from fedtsp.tables import to_markdown


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
    assert table.loc[0, "best-round acc (%)"] == f"{accs.mean():.2f} ± {accs.std():.2f}"
    assert table.loc[0, "seeds"] == "0,1"
    text = to_markdown(table)
    assert text.splitlines()[0].startswith("| algorithm | seeds |")
    assert len(text.splitlines()) == 3


def _fmcl_record(method: str, seed: int, best: float, ari: float) -> dict:
    return {
        "kind": "fmcl-benchmark",
        "status": "complete",
        "key": f"{method}{seed}",
        "population_name": "label-groups",
        "population": {"spec": {"num_clients": 4}, "groups": [0, 0, 1, 1]},
        "method": method,
        "seed": seed,
        "num_clusters": 2,
        "ari": ari,
        "nmi": ari,
        "summary": {"best_acc": best, "final_acc": best, "final_mean_client_acc": best},
        "bytes_per_client": 10.0,
        "one_shot_bytes_per_client": 0.0,
        "cluster_seconds": 0.1,
        "wall_seconds": 1.0,
        "assignment": [0, 0, 1, 1],
    }


def test_a_store_with_fmcl_records_gives_both_tables(tmp_path, tiny_data):
    run_experiment(tiny_config(rounds=1), dataset=tiny_data, out=tmp_path, progress=False)
    fmcl = [
        _fmcl_record("ifca", 0, 0.40, 0.5),
        _fmcl_record("fmcl", 0, 0.50, 1.0),
        _fmcl_record("fmcl", 1, 0.52, 1.0),
    ]
    records = [*RunStore(tmp_path).records(), *fmcl]
    assert list(runs_frame(records)["algorithm"]) == ["local"]  # FMCL records left out
    table = fmcl_table(records)
    assert list(table["method"]) == ["fmcl", "ifca"]  # in the benchmark's method order
    assert table.loc[0, "best acc (%)"].startswith("51.00 ± ")  # mean over the two seeds
    assert table.loc[0, "ARI"] == "1.000 (n = 2, all equal)"
    assert table.loc[1, "best acc (%)"] == "40.00 (n = 1)"

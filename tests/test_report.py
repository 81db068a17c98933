"""Tables from run records: the numbers are the records' numbers, aggregated over seeds."""

from __future__ import annotations

import numpy as np
from conftest import tiny_config

from fedtsp.report import runs_frame, summary_table
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

"""Profiles, run plans and table writing: the pieces the batch runner and notebooks share."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedtsp.core.config import ConfigError
from fedtsp.engine.simulation import run_key
from fedtsp.paper.experiments import DataSource, method_config
from fedtsp.paper.notebook_runs import notebook_plan
from fedtsp.paper.outputs import ResultsWriter, write_index
from fedtsp.paper.profiles import load_profile, notebook_parameters, profile_names
from fedtsp.paper.tables import (
    UNCONVERGED_NOTE,
    UNCONVERGED_SHORT,
    best_mask,
    mean_std,
    reading,
    to_latex,
    to_markdown,
)


def test_profiles_load_and_cover_every_notebook():
    assert profile_names() == ["smoke", "cpu", "evidence", "paper"]
    notebooks = None
    for name in profile_names():
        prof = load_profile(name)
        if notebooks is None:
            notebooks = set(prof.notebooks)
        assert set(prof.notebooks) == notebooks, name
    assert load_profile("paper").base["rounds"] == 300
    assert load_profile("paper").seeds == [0, 1, 2]


def test_unknown_profile_and_notebook_are_clear_errors():
    with pytest.raises(
        ConfigError, match="unknown profile 'gpu'; choose one of smoke, cpu, evidence, paper"
    ):
        load_profile("gpu")
    with pytest.raises(ConfigError, match="no parameters for notebook '99_x'"):
        notebook_parameters("smoke", "99_x")


def test_notebook_parameters_point_into_the_results_root(tmp_path):
    params = notebook_parameters("cpu", "03_main_table", tmp_path)
    assert params["store"] == str(tmp_path.resolve() / "cpu" / "runs")
    assert params["results_dir"] == str(tmp_path.resolve() / "cpu")
    assert params["seeds"] == [0, 1, 2] and params["base"]["rounds"] == 20
    assert params["base"]["partition_seed"] == "seed"  # each seed its own partition
    assert len(params["methods"]) == 12
    json.dumps(params)  # papermill needs JSON-serialisable values


def test_overrides_replace_values_merge_base_and_reject_unknown_names():
    params = notebook_parameters(
        "cpu", "03_main_table", overrides={"seeds": [0], "base": {"rounds": 3}}
    )
    assert params["seeds"] == [0]
    assert params["base"]["rounds"] == 3 and params["base"]["family"] == "htfe-cpu"
    with pytest.raises(ConfigError, match="has no parameter.*sedes"):
        notebook_parameters("cpu", "03_main_table", overrides={"sedes": [0]})
    with pytest.raises(ConfigError, match="profile"):
        notebook_parameters("cpu", "03_main_table", overrides={"profile": "paper"})


def test_a_notebooks_base_is_merged_onto_the_profiles(tmp_path):
    table3 = notebook_parameters("cpu", "07_homogeneous")["base"]
    table1 = notebook_parameters("cpu", "03_main_table")["base"]
    assert (table3["local_epochs"], table3["lr"], table1["local_epochs"], table1["lr"]) == (
        2,
        0.05,
        1,
        0.01,
    )
    assert table3["num_clients"] == table1["num_clients"] == 20  # the rest is the profile's
    bad = tmp_path / "profiles.toml"
    bad.write_text(
        '[methods]\nLocal = { algorithm = "local" }\n[p]\nabout = "x"\ndata = "synthetic"\n'
        "seeds = [0]\n[p.base]\nrounds = 2\n[p.notebooks.07_x]\nbase = { lr = -1.0 }\n"
    )
    with pytest.raises(ConfigError, match="notebook 07_x: base: lr=-1.0 is invalid"):
        load_profile("p", bad)


def test_method_config_drops_default_options_so_equal_runs_share_a_key():
    base = {"num_clients": 4, "family": "htfe-cpu", "rounds": 2}
    spelled_out = method_config(
        base, "FedTSP-MiniLM", algo_options={"trainable_prompts": True, "lam": 7.0}
    )
    plain = method_config(base, "FedTSP-MiniLM")
    assert spelled_out == plain
    assert plain.algo_options == {"prompts": "long"}
    assert method_config(base, "Local").algo_options == {}
    with pytest.raises(ConfigError, match="unknown method label 'FedFoo'"):
        method_config(base, "FedFoo")


def test_plans_share_runs_between_notebooks():
    prof = load_profile("smoke")
    source = DataSource("synthetic", 4)

    def keys(notebook):
        specs = notebook_plan(notebook, notebook_parameters(prof, notebook), source)
        return {run_key(s.config, source.datasets(s.config)) for s in specs}

    main, semantics, ablation, llm = (
        keys(n)
        for n in ("03_main_table", "02_prototype_semantics", "04_ablations", "05_llm_robustness")
    )
    # Fig. 1 reads the prototypes of Table 1's runs; Table 2's row (5) and Fig. 5's "long"
    # bar are Table 1's FedTSP. Fig. 5's long, short and template bars are Table 2's prompt
    # variants on CIFAR-10, so only WordNet's glosses cost a run of their own.
    assert semantics <= main
    assert len(llm & main) == 1
    assert len(llm & ablation) == 3
    assert len(llm - main - ablation) == 1
    # CIFAR-100 Local (row 1) and FedTSP (row 5), CIFAR-10 FedTSP (Fig. 5's "long"); one seed.
    assert len(ablation & main) == 3
    assert len(main) == 12 * 2 + 2 * 2 - 2  # Table 1 on 2 datasets + 2 families x 2 methods


def test_missing_dataset_is_skipped_with_a_note(tmp_path):
    source = DataSource(str(tmp_path))
    available, notes = source.split(["cifar10"])
    assert available == []
    assert notes and notes[0].startswith("cifar10 skipped: no offline copy here")


def test_mean_std_best_mask_and_text_formats():
    frame = pd.DataFrame(
        {
            "method": ["A", "A", "B", "B"],
            "dataset": ["x"] * 4,
            "acc": [80.0, 82.0, 85.0, 85.0],
        }
    )
    text, means, numbers = mean_std(frame, "method", "dataset", "acc")
    assert text.loc["A", "x"] == "81.00 ± 1.41"  # sample std (ddof = 1) of 80, 82
    assert text.loc["B", "x"] == "85.00 (n = 2, all equal)"
    bold = best_mask(means)
    assert bold.loc["B", "x"] and not bold.loc["A", "x"]
    md = to_markdown(text.reset_index(), bold.reset_index().assign(method=False))
    assert "| B | **85.00 (n = 2, all equal)** |" in md
    tex = to_latex(text.reset_index(), bold.reset_index().assign(method=False), "cap 5%")
    assert r"\textbf{85.00 (n = 2, all equal)}" in tex and r"\caption{cap 5\%}" in tex


def test_one_seed_shows_n_1_not_a_zero_spread():
    frame = pd.DataFrame({"method": ["A", "B", "B"], "dataset": ["x"] * 3, "acc": [80, 84, 86.0]})
    text, _, numbers = mean_std(frame, "method", "dataset", "acc")
    assert text.loc["A", "x"] == "80.00 (n = 1)"
    assert text.loc["B", "x"] == "85.00 ± 1.41"
    # The numbers behind the cells, for the CSV: n = 1 has no spread and no interval.
    assert list(numbers.columns) == ["method", "dataset", "mean", "std", "n", "ci_low", "ci_high"]
    a, b = numbers.iloc[0], numbers.iloc[1]
    assert (a["method"], a["n"], a["mean"]) == ("A", 1, 80.0) and pd.isna(a["std"])
    # t(0.975, 1 df) x std sqrt(2) / sqrt(n = 2)
    assert (b["ci_low"], b["ci_high"]) == pytest.approx((85.0 - 12.7062, 85.0 + 12.7062), abs=1e-3)
    assert mean_std(frame, "method", "dataset", "acc", decimals=3)[0].loc["A", "x"] == (
        "80.000 (n = 1)"
    )
    tiny = pd.DataFrame({"method": ["C", "C"], "dataset": ["x"] * 2, "acc": [1.0, 1.002]})
    assert mean_std(tiny, "method", "dataset", "acc")[0].loc["C", "x"] == "1.00 ± <0.01"
    assert mean_std(tiny, "method", "dataset", "acc", decimals=3)[0].loc["C", "x"] == (
        "1.001 ± 0.001"
    )


def test_results_writer_records_provenance_and_index(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    writer = ResultsWriter(tmp_path / "cpu", "03_main_table", "cpu", "about the scale")
    table = pd.DataFrame({"method": ["A", "B"], "acc": ["1.00 ± 0.00", "2.00 ± 0.00"]})
    bold = pd.DataFrame({"method": [False, False], "acc": [False, True]})
    writer.table(table, "t1", "Table 1", "caption", runs=["k1", "k2", "k1"], bold=bold)
    fig, ax = plt.subplots()
    ax.plot(np.arange(3))
    writer.figure(fig, "f3", "Fig. 3", runs=["k1"])
    fig, ax = plt.subplots()
    writer.figure(fig, "t1", "Table 1", runs=["k1"])  # a figure named like a table: both kept
    csv = (tmp_path / "cpu" / "tables" / "t1.csv").read_text()
    assert "2.00 ± 0.00 *" in csv and "1.00 ± 0.00 *" not in csv
    assert (tmp_path / "cpu" / "figures" / "f3.pdf").stat().st_size > 1000
    manifest = json.loads((tmp_path / "cpu" / "manifest" / "03_main_table.json").read_text())
    assert [(e["kind"], e["name"]) for e in manifest["artefacts"]] == [
        ("table", "t1"),
        ("figure", "f3"),
        ("figure", "t1"),
    ]
    assert manifest["artefacts"][0]["runs"] == ["k1", "k2"]
    index = write_index(tmp_path).read_text()
    assert "## Profile `cpu`" in index and "about the scale" in index
    assert "| Table 1 | t1 | `03_main_table` |" in index


def test_a_notebooks_writer_shows_each_table_and_explains_the_mark_once(tmp_path, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj.data))
    writer = ResultsWriter(tmp_path / "cpu", "03_main_table", "cpu", show=True)
    table = pd.DataFrame({"method": ["A", "B"], "acc": ["1.00 ± 0.10 †", "2.00 ± 0.20"]})
    bold = pd.DataFrame({"method": [False, False], "acc": [False, True]})
    for name in ("t1", "t2"):
        writer.table(table, name, "Table 1", f"caption of {name}", bold=bold)
    # What the reader sees is the saved file: best cell in bold, caption, the mark explained.
    saved = (tmp_path / "cpu" / "tables" / "t1.md").read_text()
    assert shown[0] + "\n" == saved and "| B | **2.00 ± 0.20** |" in saved
    assert "caption of t1" in saved and UNCONVERGED_NOTE in saved
    # The second table's file explains the mark in full; the notebook points to the first.
    assert UNCONVERGED_NOTE in (tmp_path / "cpu" / "tables" / "t2.md").read_text()
    assert UNCONVERGED_NOTE not in shown[1] and shown[1].endswith(UNCONVERGED_SHORT)
    ResultsWriter(tmp_path / "smoke", "03_main_table", "smoke").table(table, "t", "T", "c")
    assert len(shown) == 2  # a writer outside a notebook displays nothing


def test_auto_data_falls_back_to_default_places_per_dataset(tmp_path, monkeypatch):
    from pathlib import Path

    if not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists():
        pytest.skip("Debian dataset-fashion-mnist is not installed")
    monkeypatch.setenv("FEDTSP_DATA", str(tmp_path))  # a folder without Fashion-MNIST
    auto = DataSource("auto")
    assert auto.get("fmnist").train_images.shape[1:] == (1, 28, 28)
    explicit = DataSource(str(tmp_path))  # an explicit path never falls back
    assert explicit.missing_reason("fmnist").startswith("fmnist skipped: no offline copy")


def test_a_profile_can_give_each_seed_its_own_partition():
    from fedtsp.paper.experiments import partition_seed_of
    from fedtsp.paper.fmcl.benchmark import benchmark_config

    base = {"num_clients": 4, "fraction": 0.5, "family": "htfe-cpu", "rounds": 2}
    own = [method_config(base | {"partition_seed": "seed"}, "FedProto", seed=s) for s in (0, 2)]
    assert [c.partition_seed for c in own] == [0, 2]
    fixed = method_config(base, "FedProto", seed=2)
    assert fixed.partition_seed == 1  # the authors' protocol: one partition for every seed
    assert own[1].key() != fixed.key()
    assert benchmark_config("label-groups", "fmcl", 3, partition_seed="seed").partition_seed == 3
    assert benchmark_config("label-groups", "fmcl", 3).partition_seed == 1
    with pytest.raises(ConfigError, match="partition_seed='x' is invalid"):
        partition_seed_of("x", 0)
    paper = notebook_parameters("paper", "03_main_table")
    assert paper["base"]["partition_seed"] == 1


def test_a_reading_names_the_leader_the_gap_and_a_setting_that_barely_learns():
    frame = pd.DataFrame(
        {
            "method": ["A", "A", "B", "B", "C", "C"],
            "dataset": ["d1"] * 6,
            "seed": [0, 1] * 3,
            "acc": [10.0, 12.0, 9.0, 9.5, 3.0, 3.0],
        }
    )
    _, _, numbers = mean_std(frame, "method", "dataset", "acc")
    assert reading(numbers, "method", "dataset") == (
        "Reading: d1: A leads with 11.00 ± 1.41, 1.75 ahead of B."
    )
    low = reading(numbers, "method", "dataset", floor=lambda key: 50.0)
    assert "below the 50 % a setting must reach to compare methods: not a result" in low
    fast = reading(numbers, "method", "dataset", higher_is_better=False)
    assert fast.startswith("Reading (lower is better): d1: C leads with 3.00 (n = 2, all equal)")
    tie = numbers.assign(mean=[5.0, 5.0, 1.0])
    assert ", tied with B" in reading(tie, "method", "dataset")


def test_a_notebooks_set_up_is_one_object_with_every_value(tmp_path, monkeypatch, capsys):
    from fedtsp.paper.notebook import open_notebook

    monkeypatch.chdir(tmp_path)
    nb = open_notebook("03_main_table", "cpu", "results", {"seeds": [7]})
    assert nb.seeds == [7] and nb.methods == notebook_parameters("cpu", "03_main_table")["methods"]
    assert nb.store == str(Path("results") / "cpu" / "runs")  # relative: no machine path
    assert nb.writer.root == Path("results") / "cpu" and nb.source.requested == nb.data
    assert capsys.readouterr().out.startswith("profile cpu: ")
    with pytest.raises(AttributeError, match="notebook 03_main_table has no parameter 'sedes'"):
        _ = nb.sedes


def test_notebook_08_describes_fmcls_own_setting_not_the_htfl_one():
    from fedtsp.paper.profiles import notebook_parameters

    fmcl = notebook_parameters("cpu", "08_fmcl")
    assert fmcl["about"].startswith(
        "FMCL's own setting at the cpu profile: 20 rounds x 1 local epoch, 12 clients, "
        "fedavgcnn_s; populations label-groups, mixed-domain, overlapping-labels, 10% of"
    )
    smaller = notebook_parameters("cpu", "08_fmcl", overrides={"num_clients": 8})
    assert ", 8 clients, " in smaller["about"]
    assert "htfe" in notebook_parameters("cpu", "03_main_table")["about"]

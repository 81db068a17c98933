"""The notebooks and the batch runner: every notebook runs at the smoke profile and writes
its tables and figures; a failing notebook fails the batch without stopping the others; a
second reproduction is served from the run store."""

from __future__ import annotations

import json
import shutil

import nbformat
import pandas as pd
import pytest

from fedtsp.profiles import load_profile, notebook_parameters
from fedtsp.reproduce import NOTEBOOKS_DIR, find_notebooks, reproduce

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))

# Artefacts the smoke reproduction must write: (file under results/smoke/, rows it must
# contain in its first column (tables) or None (figures)).
TWELVE = ["Local", "FedProto", "FedTGP", "AlignFed", "FedGH", "FedGen", "LG-FedAvg", "FML"]
EXPECTED = {
    "tables/descriptions_stats.csv": None,
    "tables/fig1_rho.csv": ["AlignFed", "FedProto", "FedTGP", "FedTSP-MiniLM"],
    "tables/fig1_gap.csv": ["AlignFed", "FedProto", "FedTGP", "FedTSP-MiniLM"],
    "tables/table1_accuracy.csv": [*TWELVE, "FedDistill", "FedKD", "FedMRL", "FedTSP-MiniLM"],
    "tables/table1_paper_reference.csv": ["FedProto", "FedTSP-BERT"],
    "tables/appendixD_families.csv": ["FedProto", "FedTSP-MiniLM"],
    "tables/fig6_rounds_to_95pct.csv": ["Local", "FedTSP-MiniLM"],
    "tables/table2_ablation.csv": [
        "(1) local only",
        "(2) + text prototypes, handcrafted prompt",
        "(3) + LLM descriptions",
        "(4) handcrafted + trainable prompts",
        "(5) LLM descriptions + trainable prompts (FedTSP)",
    ],
    "tables/fig5_prompt_richness.csv": ["manual", "short", "long"],
    "tables/fig5_right_llm_robustness.csv": None,
    "figures/fig1e_semantic_alignment.png": None,
    "figures/fig1f_semantic_gap.png": None,
    "figures/fig1a-d_heatmaps_cifar10.pdf": None,
    "figures/fig3_local_vs_global_cifar10.png": None,
    "figures/fig4_top1_top5_cifar100.png": None,
    "figures/fig6_convergence.png": None,
    "figures/table2_ablation_bars.png": None,
    "figures/fig5_left_prompt_richness.png": None,
    "figures/fig5_right_llm_robustness.png": None,
    "tables/table4_dp.csv": ["no DP", "8", "4", "2", "1"],
    "figures/table4_dp_tradeoff.png": None,
    "tables/table3_homogeneous.csv": ["GFL", "PFL"],
    "figures/table3_homogeneous_bars.png": None,
    "tables/fmcl_benchmark.csv": ["label-groups", "mixed-domain"],
    "figures/fmcl_accuracy.png": None,
    "figures/fmcl_ari.png": None,
}


def test_every_notebook_has_a_parameters_cell_and_no_outputs():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07", "08"]
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        tagged = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, path.name
        code = [c for c in book.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), path.name
        # Every value a profile injects must be a variable the parameters cell defines.
        defined = set()
        for line in tagged[0].source.splitlines():
            if "=" in line and not line.startswith((" ", "#")):
                defined.add(line.split("=")[0].strip())
        for profile in ("smoke", "cpu", "paper"):
            injected = set(notebook_parameters(profile, path.stem))
            assert injected <= defined, (path.name, profile, injected - defined)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    status = reproduce(
        "smoke", results_root=root / "results", papermill_root=root / "pm", progress=False
    )
    return root, status


@pytest.mark.slow
def test_smoke_reproduction_writes_every_artefact(smoke):
    root, status = smoke
    assert status == 0
    out = root / "results" / "smoke"
    for rel, rows in EXPECTED.items():
        path = out / rel
        # A one-column table of three rows is ~80 bytes; a rendered figure is many kB.
        assert path.is_file() and path.stat().st_size > (40 if rel.endswith(".csv") else 5000), rel
        if rows is not None:
            first = pd.read_csv(path).iloc[:, 0].astype(str).str.rstrip(" *").tolist()
            assert set(rows) <= set(first), (rel, first)
    table1 = pd.read_csv(out / "tables" / "table1_accuracy.csv")
    assert list(table1.columns) == ["method", "cifar10 / 0.1", "cifar100 / 0.1"]
    assert len(table1) == 12
    assert (out / "tables" / "table1_accuracy.tex").read_text().count(r"\\") >= 13
    table3 = pd.read_csv(out / "tables" / "table3_homogeneous.csv")
    assert set(table3["method"].str.rstrip(" *")) == {
        "FedAvg", "FedBABU", "FedETF", "FedFA", "FedTSP-GFL", "FedAvg-FT", "FedBABU-FT",
        "FedETF-Per", "FedFA-FT", "FedPCL", "FedPAC", "FedTSP-FT",
    }  # fmt: skip
    fmcl = pd.read_csv(out / "tables" / "fmcl_benchmark.csv")
    assert len(fmcl) == 2 * 7 and {"ARI", "NMI", "clusters", "MB per client"} <= set(fmcl.columns)
    for nb in NOTEBOOKS:
        assert (root / "pm" / "smoke" / nb.name).is_file()
    # Tiny-ImageNet has no synthetic stand-in: skipped with a note, not silently.
    md = (out / "tables" / "table1_accuracy.md").read_text()
    assert "tinyimagenet skipped" in md
    index = (root / "results" / "README.md").read_text()
    assert index.count("| Table 1 |") == 1 and "`03_main_table`" in index


@pytest.mark.slow
def test_second_reproduction_is_served_from_the_store(smoke):
    root, _ = smoke
    runs = root / "results" / "smoke" / "runs"
    before = {p.name: p.stat().st_mtime_ns for p in runs.glob("*.json")}
    assert len(before) >= 30
    status = reproduce(
        "smoke",
        only=["05"],
        results_root=root / "results",
        papermill_root=root / "pm",
        progress=False,
    )
    assert status == 0
    after = {p.name: p.stat().st_mtime_ns for p in runs.glob("*.json")}
    assert after == before  # nothing rerun, nothing rewritten
    executed = nbformat.read(root / "pm" / "smoke" / "05_llm_robustness.ipynb", as_version=4)
    text = json.dumps([c.get("outputs", []) for c in executed.cells])
    assert "to run" not in text  # run_all announces runs only when some must run


def test_a_failing_notebook_fails_the_batch_but_not_the_others(tmp_path):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    shutil.copy(NOTEBOOKS_DIR / "05_llm_robustness.ipynb", nbdir)
    broken = nbformat.read(NOTEBOOKS_DIR / "01_descriptions.ipynb", as_version=4)
    broken.cells.insert(2, nbformat.v4.new_code_cell("raise RuntimeError('planted failure')"))
    nbformat.write(broken, nbdir / "01_descriptions.ipynb")
    status = reproduce(
        "smoke",
        results_root=tmp_path / "results",
        papermill_root=tmp_path / "pm",
        notebooks_dir=nbdir,
        progress=False,
    )
    assert status == 1
    summary = json.loads((tmp_path / "results" / "smoke" / "reproduce_summary.json").read_text())
    assert summary["notebooks"]["01_descriptions"]["ok"] is False
    assert summary["notebooks"]["05_llm_robustness"]["ok"] is True
    assert (tmp_path / "results" / "smoke" / "tables" / "fig5_right_llm_robustness.csv").is_file()


def test_only_selects_notebooks_and_rejects_unknown_prefixes():
    assert [p.stem for p in find_notebooks(NOTEBOOKS_DIR, ["03", "05"])] == [
        "03_main_table",
        "05_llm_robustness",
    ]
    with pytest.raises(Exception, match="--only 42 matches no notebook"):
        find_notebooks(NOTEBOOKS_DIR, ["42"])
    assert load_profile("smoke").data == "synthetic"

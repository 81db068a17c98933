"""The notebooks and the batch runner: every notebook runs at the smoke profile and writes
its tables and figures; a failing notebook fails the batch without stopping the others; a
second reproduction is served from the run store and changes no output byte; a notebook
that lacks something its profile expects is partial, loudly."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from fedtsp.core.paths import REPO_ROOT
from fedtsp.paper.experiments import run_all
from fedtsp.paper.profiles import load_profile, notebook_parameters
from fedtsp.paper.ray_executor import RayExecutor
from fedtsp.paper.reproduce import NOTEBOOKS_DIR, collect_runs, find_notebooks, reproduce
from fedtsp.paper.verify import compare_histories

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))

# Artefacts the smoke reproduction must write: (file under results/smoke/, rows it must
# contain in its first column (tables) or None (figures)).
TWELVE = ["Local", "FedProto", "FedTGP", "AlignFed", "FedGH", "FedGen", "LG-FedAvg", "FML"]
EXPECTED = {
    "tables/descriptions_stats.csv": None,
    "tables/fig1_rho.csv": ["AlignFed", "FedProto", "FedTGP", "FedTSP-MiniLM"],
    "tables/fig1_gap.csv": ["AlignFed", "FedProto", "FedTGP", "FedTSP-MiniLM"],
    "tables/table1_accuracy.csv": [
        *TWELVE,
        "FedDistill",
        "FedKD",
        "FedMRL",
        "FedTSP-MiniLM",
        "Label prior",
    ],
    "tables/table1_above_label_prior.csv": ["Local", "FedTSP-MiniLM"],
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
    "tables/table2_controls.csv": ["minilm"],
    "tables/table2_authors_runs.csv": ["cifar10"],
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
    "figures/table3_gfl_bars.png": None,
    "figures/table3_pfl_bars.png": None,
    "tables/fmcl_benchmark.csv": ["label-groups", "mixed-domain", "overlapping-labels"],
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
        # The parameters cell names a profile (cpu by default) and nothing the profile holds:
        # every other value is read from profiles.toml, so it is written once.
        defined = {
            line.split("=")[0].strip(): line.split("=", 1)[1].split("#")[0].strip()
            for line in tagged[0].source.splitlines()
            if "=" in line and not line.startswith((" ", "#"))
        }
        own = {"llm_model", "llm_base_url"} if path.stem == "01_descriptions" else set()
        assert set(defined) == {"profile", "overrides", "results_root", *own}, path.name
        assert defined["profile"] == '"cpu"' and defined["overrides"] == "{}", path.name
        # The set-up cell is one call, and every value the notebook reads from it (nb.x)
        # exists at every profile.
        setup = code[code.index(tagged[0]) + 1].source
        assert f'nb = open_notebook("{path.stem}", profile, results_root, overrides)' in setup
        used = {m for c in code for m in re.findall(r"\bnb\.(\w+)", re.sub("#.*", "", c.source))}
        used -= {"source", "writer", "params", "name", "plan", "runs"}
        for profile in ("smoke", "cpu", "evidence", "paper"):
            missing = used - set(notebook_parameters(profile, path.stem))
            assert not missing, (path.name, profile, missing)


def test_every_notebook_runs_what_the_batch_runner_plans_and_no_more(tmp_path):
    """Under an analysis plan (the evidence profile) a notebook asks for the plan's seeds of
    each group, as `fedtsp reproduce` planned them, never every seed of every group."""
    from fedtsp.paper import notebook_runs
    from fedtsp.paper.notebook import open_notebook

    for path in NOTEBOOKS[1:]:  # 01 runs no experiment
        code = "".join(c.source for c in nbformat.read(path, as_version=4).cells)
        assert "specs = nb.runs()" in code, path.name
        assert "(nb.params, nb.source)" not in code, path.name
    nb = open_notebook("08_fmcl", "evidence", str(tmp_path))
    planned = notebook_runs.notebook_plan("08_fmcl", nb.params, nb.source)
    every = notebook_runs.fmcl_benchmark(nb.params, nb.source)
    assert [s.config for s in nb.runs()] == [s.config for s in planned]
    assert 100 < len(planned) < len(every) / 5


def test_a_notebook_opened_as_it_is_shows_the_committed_cpu_results_and_runs_nothing(tmp_path):
    """No injected parameters: the default profile (cpu) over the committed run store."""
    import papermill

    nbdir, store = tmp_path / "notebooks", tmp_path / "results" / "cpu" / "runs"
    nbdir.mkdir()
    shutil.copy(NOTEBOOKS_DIR / "05_llm_robustness.ipynb", nbdir)
    shutil.copytree(REPO_ROOT / "results" / "cpu" / "runs", store)
    mtimes = {p.name: p.stat().st_mtime_ns for p in store.iterdir()}
    papermill.execute_notebook(
        str(nbdir / "05_llm_robustness.ipynb"),
        str(tmp_path / "executed.ipynb"),
        cwd=str(nbdir),
        kernel_name="python3",
        progress_bar=False,
    )
    assert {p.name: p.stat().st_mtime_ns for p in store.iterdir()} == mtimes  # nothing ran
    name = "tables/fig5_right_llm_robustness.md"
    ours = (tmp_path / "results" / "cpu" / name).read_text()
    assert ours == (REPO_ROOT / "results" / "cpu" / name).read_text()


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
    # The CSV holds the numbers, one row per cell: mean, sample std, n and 95 % interval.
    numbers = ["mean", "std", "n", "ci_low", "ci_high"]
    # and whether every run of the cell converged; the floor row comes last in each column
    assert list(table1.columns) == ["method", "dataset", "alpha", *numbers, "converged"]
    assert len(table1) == 13 * 2 and (table1["n"] == 1).all()
    assert table1["method"].tolist()[-1] == "Label prior"
    # A cell is its run's best-round accuracy, and the floor row its label prior, in %.
    from fedtsp.paper.floors import record_label_prior

    (local,) = {
        json.dumps([r["summary"]["best_acc"], record_label_prior(r)]): r
        for r in map(json.loads, map(Path.read_text, (out / "runs").glob("*.json")))
        if r.get("kind") == "federated"
        and r["config"]["algorithm"] == "local"
        and (r["config"]["dataset"], r["config"]["alpha"]) == ("cifar10", 0.1)
        and r["config"]["family"] == "htfe-cpu"
    }.values()
    cells = table1[(table1["dataset"] == "cifar10") & (table1["alpha"] == 0.1)]
    cell = dict(zip(cells["method"].str.rstrip(" *"), cells["mean"], strict=True))
    assert cell["Local"] == pytest.approx(100 * local["summary"]["best_acc"])
    assert cell["Label prior"] == pytest.approx(record_label_prior(local))  # already in %
    assert (out / "tables" / "table1_accuracy.tex").read_text().count(r"\\") >= 13
    table3 = pd.read_csv(out / "tables" / "table3_homogeneous.csv")
    assert set(table3["method"].str.rstrip(" *")) == {
        "FedAvg", "FedBABU", "FedETF", "FedFA", "FedTSP-GFL", "FedAvg-FT", "FedBABU-FT",
        "FedETF-Per", "FedFA-FT", "FedPCL", "FedPAC", "FedTSP-FT", "Label prior",
    }  # fmt: skip
    # the floor of the personalised block only: the GFL block is scored on a balanced test set
    assert set(table3.loc[table3["method"] == "Label prior", "block"]) == {"PFL"}
    fmcl = pd.read_csv(out / "tables" / "fmcl_benchmark.csv")
    assert len(fmcl) == 3 * 7  # populations x methods
    assert {"ari_mean", "nmi_std", "num_clusters_ci_low", "bytes_per_client_mean"} <= set(fmcl)
    assert "MiB per client" in (out / "tables" / "fmcl_benchmark.md").read_text()
    for nb in NOTEBOOKS:
        assert (root / "pm" / "smoke" / nb.name).is_file()
    # Tiny-ImageNet has no synthetic stand-in: a planned skip, with a note, not silently.
    md = (out / "tables" / "table1_accuracy.md").read_text()
    assert "tinyimagenet left out (planned: synthetic data" in md
    summary = json.loads((out / "reproduce_summary.json").read_text())
    assert {nb["status"] for nb in summary["notebooks"].values()} == {"ok"}
    # Every run, in the batch's workers or a notebook's kernel, ran the AVX2 pins.
    records = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    assert records and {r["environment"]["isa"]["tag"] for r in records} == {"avx2 (pinned)"}
    skipped = summary["notebooks"]["03_main_table"]["skipped"]
    assert [(s["item"], s["planned"]) for s in skipped] == [("tinyimagenet", True)]
    index = (root / "results" / "README.md").read_text()
    assert index.count("| Table 1 |") == 1 and "`03_main_table`" in index


def _output_bytes(root) -> dict[str, bytes]:
    skip = {"reproduce_timings.json"}  # wall times: the one output meant to change
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in skip and "checkpoints" not in p.parts
    }


@pytest.mark.slow
def test_second_reproduction_is_served_from_the_store_and_changes_no_byte(smoke):
    root, _ = smoke
    runs = root / "results" / "smoke" / "runs"
    before = _output_bytes(root)
    mtimes = {p.name: p.stat().st_mtime_ns for p in runs.glob("*.json")}
    assert len(mtimes) >= 30
    stale = [runs / "0123456789abcdef.json", runs / "0123456789abcdef.artifacts.npz"]
    for path in stale:  # a record of a run no notebook plans any longer
        path.write_text("{}")
    status = reproduce(
        "smoke",
        results_root=root / "results",
        papermill_root=root / "pm",
        progress=False,
        prune=True,
    )
    assert status == 0
    assert not any(path.exists() for path in stale)  # pruned, and every used record kept:
    assert {p.name: p.stat().st_mtime_ns for p in runs.glob("*.json")} == mtimes  # none rerun
    after = _output_bytes(root)
    assert sorted(after) == sorted(before)
    changed = [name for name in before if before[name] != after[name]]
    assert changed == [], changed
    executed = nbformat.read(root / "pm" / "smoke" / "05_llm_robustness.ipynb", as_version=4)
    text = json.dumps([c.get("outputs", []) for c in executed.cells])
    assert "to run" not in text  # run_all announces runs only when some must run
    # No output holds an absolute path of this machine (the repository, its parent, home).
    for name, data in after.items():
        text = data.decode("utf-8", errors="replace")
        for path in (str(REPO_ROOT), str(REPO_ROOT.parent) + "/", str(Path.home()) + "/"):
            assert path not in text, (name, path)


@pytest.mark.slow
def test_the_ray_executor_gives_the_records_of_the_local_one(smoke, ray_cluster, tmp_path):
    """Every run of the smoke profile again, as Ray tasks on a local 2-CPU cluster: the
    same keys and, round by round, the same histories as the local executor's."""
    root, _ = smoke
    profile = load_profile("smoke")
    specs, source = collect_runs(profile, find_notebooks(NOTEBOOKS_DIR), root / "results")
    local = run_all(specs, source, root / "results" / "smoke" / "runs", progress=False)
    assert all(r["cache_hit"] for r in local) and len({r["key"] for r in local}) >= 60
    on_ray = run_all(
        specs, source, tmp_path / "runs", progress=False, executor=RayExecutor(profile)
    )
    assert not any(r["cache_hit"] for r in on_ray)
    for ours, theirs in zip(local, on_ray, strict=True):
        assert ours["key"] == theirs["key"]
        assert compare_histories(ours["history"], theirs["history"]) == ({}, None), ours["key"]


def _reproduce_with_cell(tmp_path, source: str, after: str | None, **options) -> int:
    """Reproduce the smoke profile over a copy of notebook 01 with one cell added.

    The cell goes after the first cell containing `after` (None: before the first code
    cell, ahead of the set-up cell and its `short_errors()`). The summary lands in tmp_path.
    """
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    book = nbformat.read(NOTEBOOKS_DIR / "01_descriptions.ipynb", as_version=4)
    at = 2 if after is None else next(i for i, c in enumerate(book.cells) if after in c.source) + 1
    book.cells.insert(at, nbformat.v4.new_code_cell(source))
    nbformat.write(book, nbdir / "01_descriptions.ipynb")
    if options.pop("with_05", False):
        shutil.copy(NOTEBOOKS_DIR / "05_llm_robustness.ipynb", nbdir)
    return reproduce(
        "smoke",
        results_root=tmp_path / "results",
        papermill_root=tmp_path / "pm",
        notebooks_dir=nbdir,
        progress=False,
        **options,
    )


def _summary(tmp_path) -> dict:
    return json.loads((tmp_path / "results" / "smoke" / "reproduce_summary.json").read_text())


def test_a_failing_notebook_fails_the_batch_but_not_the_others(tmp_path):
    bug = "raise RuntimeError('planted failure')"
    assert _reproduce_with_cell(tmp_path, bug, None, with_05=True) == 1
    summary = _summary(tmp_path)
    assert summary["notebooks"]["01_descriptions"]["status"] == "failed"
    assert "planted failure" in summary["notebooks"]["01_descriptions"]["error"]
    assert summary["notebooks"]["05_llm_robustness"]["status"] == "ok"
    assert (tmp_path / "results" / "smoke" / "tables" / "fig5_right_llm_robustness.csv").is_file()


def test_only_selects_notebooks_and_rejects_unknown_prefixes():
    assert [p.stem for p in find_notebooks(NOTEBOOKS_DIR, ["03", "05"])] == [
        "03_main_table",
        "05_llm_robustness",
    ]
    with pytest.raises(Exception, match="--only 42 matches no notebook"):
        find_notebooks(NOTEBOOKS_DIR, ["42"])
    assert load_profile("smoke").data == "synthetic"


@pytest.mark.parametrize(
    ("item", "allow", "status", "word"),
    [
        ("fmnist", False, 3, "PARTIAL"),  # expected by the profile, missing here
        ("fmnist", True, 0, "PARTIAL"),  # --allow-partial accepts it, still says so
        ("tinyimagenet", False, 0, "planned"),  # the smoke profile plans this one
    ],
)
def test_a_partial_notebook_is_loud_and_fails_without_allow_partial(
    tmp_path, capsys, item, allow, status, word
):
    # The notebook's data lacks `item`, as on a machine without it.
    skip = (
        f"nb.writer.skip({item!r}, 'the FMCL mixed-domain rows', 'no copy found here', "
        "'apt-get install dataset-fashion-mnist')"
    )
    code = _reproduce_with_cell(tmp_path, skip, "open_notebook(", allow_partial=allow)
    out = capsys.readouterr().out
    assert code == status
    partial = word == "PARTIAL"
    entry = _summary(tmp_path)["notebooks"]["01_descriptions"]
    assert entry["status"] == ("partial" if partial else "ok")
    assert (item, not partial) in [(s["item"], s["planned"]) for s in entry["skipped"]]
    index = (tmp_path / "results" / "README.md").read_text()
    executed = (tmp_path / "pm" / "smoke" / "01_descriptions.ipynb").read_text()
    if partial:
        # runner summary, results index and the notebook's own output all say it
        assert "PARTIAL results" in out and "apt-get install dataset-fashion-mnist" in out
        assert "**PARTIAL**" in index and "`01_descriptions` **(partial)**" in index
        assert "PARTIAL: the FMCL mixed-domain rows lack fmnist" in executed
    else:
        assert "Planned skips" in out and "tinyimagenet" in out and "PARTIAL" not in out
        assert "- planned: `01_descriptions`" in index and "planned skip: tinyimagenet" in executed


def test_a_user_error_in_a_notebook_shows_one_sentence_not_frames(tmp_path):
    bad = "from fedtsp.data import load_dataset\n\nload_dataset('cifar10', '/no/such/data.tar.gz')"
    assert _reproduce_with_cell(tmp_path, bad, "open_notebook(") == 1
    executed = nbformat.read(tmp_path / "pm" / "smoke" / "01_descriptions.ipynb", as_version=4)
    (error,) = [o for c in executed.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert len(error.traceback) == 1
    assert error.traceback[0].startswith("fedtsp: error: CIFAR-10 not found")
    assert "/no/such/data.tar.gz" in error.traceback[0]
    error = _summary(tmp_path)["notebooks"]["01_descriptions"]["error"]
    assert error.startswith("fedtsp: error: CIFAR-10")

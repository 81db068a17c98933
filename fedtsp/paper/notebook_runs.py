"""The runs behind each notebook, from the notebook's parameters.

One function per notebook turns its parameters (as injected from `profiles.toml`) into
`RunSpec`s. The notebook calls it to fetch its records; the batch runner calls the same
function beforehand to run every missing experiment of a reproduction in parallel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedtsp.algorithms.fedtsp import PROMPT_VARIANTS
from fedtsp.data.populations import POPULATIONS
from fedtsp.paper.claims.findings import AUTHORS_RUNS  # Table 2's extra rows
from fedtsp.paper.experiments import DataSource, RunSpec, method_config, seed_group
from fedtsp.paper.fmcl.benchmark import benchmark_specs
from fedtsp.text.descriptions import DESCRIPTION_SETS_DIR


def _per_seed(
    params: dict[str, Any],
    method: str,
    labels: dict[str, Any],
    *,
    seeds: list[int] | None = None,
    **fields: Any,
) -> list[RunSpec]:
    """Method label `method` on the notebook's base config, once per seed (default: `params`')."""
    configs = [
        method_config(params["base"], method, params.get("method_options"), seed=s, **fields)
        for s in (params["seeds"] if seeds is None else seeds)
    ]
    return [RunSpec(config, dict(labels)) for config in configs]


def _grid(
    params: dict[str, Any],
    datasets: list[str],
    alphas: list[float],
    methods: list[str],
    seeds: list[int],
    **fields: Any,
) -> list[RunSpec]:
    specs = []
    for dataset in datasets:
        for alpha in alphas:
            for method in methods:
                labels = {"dataset": dataset, "alpha": alpha, "method": method}
                specs += _per_seed(
                    params, method, labels, seeds=seeds, dataset=dataset, alpha=alpha, **fields
                )
    for spec in specs:
        spec.labels["family"] = spec.config.family
    return specs


def main_table(params: dict[str, Any], source: DataSource) -> list[RunSpec]:
    """Table 1 (methods x datasets x alphas) and Appendix D (methods x families)."""
    datasets, _ = source.split(params["datasets"])
    specs = _grid(params, datasets, params["alphas"], params["methods"], params["seeds"])
    if params.get("hetero_families") and params["hetero_dataset"] in datasets:
        for family in params["hetero_families"]:
            specs += _grid(
                params,
                [params["hetero_dataset"]],
                [params["hetero_alpha"]],
                params["hetero_methods"],
                params["hetero_seeds"],
                family=family,
            )
    return specs


def prototype_semantics(params: dict[str, Any], source: DataSource) -> list[RunSpec]:
    """Fig. 1: the runs whose global prototypes are compared (shared with Table 1)."""
    datasets, _ = source.split(params["datasets"])
    return _grid(params, datasets, [params["alpha"]], params["methods"], params["seeds"])


# Table 2's rows: (label, prompts, trainable prompts); row 1 is plain local training.
ABLATION_ROWS = (
    ("(2) + text prototypes, handcrafted prompt", "manual", False),
    ("(3) + LLM descriptions", "long", False),
    ("(4) handcrafted + trainable prompts", "manual", True),
    ("(5) LLM descriptions + trainable prompts (FedTSP)", "long", True),
)
LOCAL_ROW = "(1) local only"


def ablations(params: dict[str, Any], source: DataSource) -> list[RunSpec]:
    """Table 2 (rows x text encoders, and the semantic controls beside row 2), the authors'
    runs beside the paper's reading per dataset, and Fig. 5 left (prompt variants x
    datasets)."""
    dataset, alpha = params["dataset"], params["alpha"]
    specs = []
    if dataset in source.split([dataset])[0]:
        for encoder in params["text_encoders"]:
            labels = {"part": "table2", "text_encoder": encoder, "dataset": dataset}
            # Row 1 does not depend on the encoder: the same Local runs stand in every block.
            specs += _per_seed(
                params, "Local", labels | {"row": LOCAL_ROW}, dataset=dataset, alpha=alpha
            )
            for row, prompts, trainable in ABLATION_ROWS:
                options = {
                    "text_encoder": encoder,
                    "prompts": prompts,
                    "trainable_prompts": trainable,
                }
                specs += _per_seed(
                    params,
                    "FedTSP-MiniLM",
                    labels | {"row": row},
                    dataset=dataset,
                    alpha=alpha,
                    algo_options=options,
                )
            # Semantic controls: row 2's fixed targets without the text's meaning.
            for control in params.get("controls", []):
                options = {
                    "text_encoder": encoder,
                    "prompts": "manual",
                    "trainable_prompts": False,
                    "targets": control,
                }
                specs += _per_seed(
                    params,
                    "FedTSP-MiniLM",
                    labels | {"part": "controls", "control": control},
                    dataset=dataset,
                    alpha=alpha,
                    algo_options=options,
                )
    for ds in source.split(params["authors_datasets"])[0]:
        for method in AUTHORS_RUNS:
            labels = {"part": "authors", "dataset": ds, "method": method}
            specs += _per_seed(params, method, labels, dataset=ds, alpha=alpha)
    datasets, _ = source.split(params["prompt_datasets"])
    for ds in datasets:
        for variant in params["prompt_variants"]:
            labels = {"part": "fig5", "dataset": ds, "prompts": variant}
            specs += _per_seed(
                params,
                "FedTSP-MiniLM",
                labels,
                dataset=ds,
                alpha=alpha,
                algo_options={"prompts": variant},
            )
    return specs


def description_options(dataset: str, desc: str) -> dict[str, Any]:
    """FedTSP options that make it read description set `desc` on `dataset`: "manual" (the
    template), a committed variant ("short", "long", "wordnet": `<dataset>_<desc>.json`) or a
    file path."""
    if desc in PROMPT_VARIANTS:
        return {"prompts": desc}
    committed = f"{dataset}_{desc}"
    if (DESCRIPTION_SETS_DIR / f"{committed}.json").is_file():
        return {"prompts": "long", "description_set": committed}
    return {"prompts": "long", "description_set": desc}


def llm_robustness(params: dict[str, Any], source: DataSource) -> list[RunSpec]:
    """Fig. 5 right: FedTSP once per description set (its writer is read from the set)."""
    datasets, _ = source.split(params["datasets"])
    specs = []
    for ds in datasets:
        for desc in params["description_sets"]:
            labels = {"dataset": ds, "description_set": desc}
            specs += _per_seed(
                params,
                "FedTSP-MiniLM",
                labels,
                dataset=ds,
                alpha=params["alpha"],
                algo_options=description_options(ds, desc),
            )
    return specs


def differential_privacy(params: dict[str, Any], source: DataSource) -> list[RunSpec]:
    """Table 4: FedTSP without DP (Table 1's run) and with the DP upload at each epsilon."""
    dataset = params["dataset"]
    if dataset not in source.split([dataset])[0]:
        return []
    specs = []
    for epsilon in [None, *params["epsilons"]]:
        options = {}
        if epsilon is not None:
            options = {
                "dp_epsilon": float(epsilon),
                "dp_delta": params["dp_delta"],
                "dp_clip": params["dp_clip"],
            }
        labels = {"dataset": dataset, "epsilon": epsilon}
        specs += _per_seed(
            params,
            "FedTSP-MiniLM",
            labels,
            dataset=dataset,
            alpha=params["alpha"],
            algo_options=options,
        )
    return specs


def homogeneous(params: dict[str, Any], source: DataSource) -> list[RunSpec]:
    """Table 3: GFL and PFL methods, every client with the same architecture."""
    dataset = params["dataset"]
    if dataset not in source.split([dataset])[0]:
        return []
    specs = []
    for block, key in (("GFL", "gfl_methods"), ("PFL", "pfl_methods")):
        for method in params[key]:
            labels = {"dataset": dataset, "block": block, "method": method}
            specs += _per_seed(
                params,
                method,
                labels,
                dataset=dataset,
                alpha=params["alpha"],
                family=params["family"],
            )
    return specs


def fmcl_benchmark(params: dict[str, Any], source: DataSource) -> list[RunSpec]:
    """The FMCL benchmark: clustered methods x populations x seeds (populations whose
    datasets do not load here are left out; the notebook reports them)."""
    populations = [
        name
        for name in params["populations"]
        if not source.split(list(POPULATIONS[name].datasets))[1]
    ]
    return benchmark_specs(
        populations,
        params["fmcl_methods"],
        params["seeds"],
        num_clients=params["num_clients"],
        fraction=params["population_fraction"],
        rounds=params["fmcl_rounds"],
        local_epochs=params["fmcl_local_epochs"],
        arch=params["fmcl_arch"],
        lr=params["fmcl_lr"],
        encoder_input_size=params["encoder_input_size"],
        partition_seed=params.get("partition_seed", 1),
    )


def no_runs(params: dict[str, Any], source: DataSource) -> list[RunSpec]:
    return []


PLANS: dict[str, Callable[[dict[str, Any], DataSource], list[RunSpec]]] = {
    "01_descriptions": no_runs,
    "02_prototype_semantics": prototype_semantics,
    "03_main_table": main_table,
    "04_ablations": ablations,
    "05_llm_robustness": llm_robustness,
    "06_dp": differential_privacy,
    "07_homogeneous": homogeneous,
    "08_fmcl": fmcl_benchmark,
}


def notebook_plan(notebook: str, params: dict[str, Any], source: DataSource) -> list[RunSpec]:
    """The runs notebook `notebook` needs with parameters `params` (empty if it needs none).

    Under an analysis plan (`params["plan_seeds"]`, group -> n) each group of runs keeps
    the first n of the profile's seeds; a group the plan gives no seeds is not run.
    """
    specs = PLANS.get(notebook, no_runs)(params, source)
    planned = params.get("plan_seeds")
    if planned is None:
        return specs
    rank = {seed: i for i, seed in enumerate(params["seeds"])}
    return [
        s
        for s in specs
        if rank.get(s.config.seed, len(rank)) < planned.get(seed_group(s.config), 0)
    ]

"""Semantics of MiniLM text prototypes before any training (issue 3's closing measurement).

For CIFAR-10 and CIFAR-100 and each prompt variant (manual template, committed short and
long description sets), encode the class prompts with the frozen offline MiniLM, average
each class's prompt features into its prototype, and compare the prototypes' cosine
similarities with WordNet Wu-Palmer similarities (Spearman rho over class pairs) and with
the semantic groups (within-group minus across-group mean similarity).

    python results/text_prototypes/measure.py      # writes table.md and heatmap PNGs here
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from fedtsp.core.results import code_version  # noqa: E402
from fedtsp.data import dataset_info  # noqa: E402
from fedtsp.models.prompts import PromptLearner  # noqa: E402
from fedtsp.models.text import build_text_encoder  # noqa: E402
from fedtsp.paper.semantics import (  # noqa: E402
    group_ids,
    plot_similarity_heatmap,
    prototype_similarity,
    semantic_alignment,
    semantic_gap,
    wordnet_similarity,
)
from fedtsp.text.descriptions import class_prompts  # noqa: E402

HERE = Path(__file__).resolve().parent
DATASETS = ("cifar10", "cifar100")
VARIANTS = ("manual", "short", "long")


def main() -> None:
    encoder = build_text_encoder("minilm")
    rows = []
    for dataset in DATASETS:
        names = list(dataset_info(dataset).classes)
        reference = wordnet_similarity(dataset, names, measure="wup")
        groups = group_ids(dataset, names)
        rows.append(
            (dataset, "WordNet Wu-Palmer (reference)", 1.0, semantic_gap(reference, groups))
        )
        for variant in VARIANTS:
            prompts = class_prompts(names, variant, dataset=dataset)
            protos = PromptLearner(encoder, prompts, n_ctx=0).frozen_prototypes()
            sim = prototype_similarity(protos)
            rows.append(
                (dataset, variant, semantic_alignment(sim, reference), semantic_gap(sim, groups))
            )
            fig, ax = plt.subplots(figsize=(6, 5) if dataset == "cifar10" else (14, 12))
            plot_similarity_heatmap(
                sim, names, groups=groups, ax=ax, title=f"MiniLM {variant} prompts, {dataset}"
            )
            fig.savefig(HERE / f"heatmap_{dataset}_{variant}.png", dpi=110, bbox_inches="tight")
            plt.close(fig)
    version = code_version()
    lines = [
        "# MiniLM text prototypes before training: WordNet alignment and semantic gap",
        "",
        "Prototype = mean MiniLM feature (masked mean pooling) of a class's prompts; no prompt",
        "vectors, no training. rho = Spearman correlation between prototype cosine similarities",
        "and WordNet 3.0 Wu-Palmer similarities over all class pairs; gap = mean within-group",
        "minus mean across-group similarity (CIFAR-10: animals/vehicles; CIFAR-100: the 20",
        "superclasses). Produced by `python results/text_prototypes/measure.py` at commit "
        f"`{(version['git_commit'] or 'unknown')[:10]}` (dirty: {version['git_dirty']}).",
        "",
        "| dataset | prompts | rho | semantic gap |",
        "|---|---|---|---|",
    ]
    lines += [f"| {d} | {v} | {rho:.3f} | {gap:.3f} |" for d, v, rho, gap in rows]
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

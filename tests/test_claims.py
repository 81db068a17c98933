"""The claims registry, the verdict rule and the findings each notebook computes."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fedtsp.paper import claims as C
from fedtsp.paper import notebook_runs
from fedtsp.paper.claims.registry import paper_gains
from fedtsp.paper.reproduce import NOTEBOOKS_DIR
from fedtsp.paper.statistics import Summary, summarize


def _effect(*values: float) -> Summary:
    return summarize(values)


@pytest.mark.parametrize(
    ("values", "kind", "expected"),
    [
        ((1.0, 1.2, 0.9), "above", C.HOLDS),
        ((-1.0, -1.2, -0.9), "above", C.CONTRADICTED),
        ((1.0, -1.0, 0.5), "above", C.NOT_SEPARATED),
        ((0.05, -0.05, 0.0, 0.02, -0.02), "above", C.EQUIVALENT),  # inside ±1, well measured
        ((0.9, -0.9, 0.0), "above", C.NOT_SEPARATED),  # inside ±1 on average, too wide
        ((2.0,), "above", C.NOT_TESTABLE),  # one seed: no interval
        ((0.1, -0.1, 0.0), "within", C.HOLDS),
        ((3.0, 3.2, 2.9), "within", C.CONTRADICTED),
        ((-3.0, -3.2, -2.9), "within", C.CONTRADICTED),
        ((0.5, 1.5, 1.0), "within", C.NOT_SEPARATED),
        ((-0.5, -0.4, -0.6), "no_worse", C.HOLDS),
        ((-2.0, -2.1, -1.9), "no_worse", C.CONTRADICTED),
        ((-1.0, -0.5, -1.5), "no_worse", C.NOT_SEPARATED),
    ],
)
def test_the_verdict_rule_reads_the_interval_against_zero_or_the_tolerance(values, kind, expected):
    assert C.TOLERANCE == 1.0
    assert C.verdict(_effect(*values), kind) == expected


def test_the_rule_rejects_an_unknown_kind_and_states_its_numbers():
    with pytest.raises(ValueError, match="kind='equal'"):
        C.verdict(_effect(1.0, 2.0), "equal")
    assert "95 %" in C.RULE and "5x chance" in C.RULE and "Holm" in C.RULE
    assert "halfway from chance to 100 %" in C.RULE and "label prior" in C.RULE
    assert "within 5 points of the floor" in C.RULE and "95 %" in C.RULE


def test_a_claim_combines_its_parts():
    assert C.overall([C.EQUIVALENT, C.EQUIVALENT, C.NOT_TESTABLE]) == C.EQUIVALENT
    assert C.overall([C.HOLDS, C.EQUIVALENT]) == C.NOT_SEPARATED
    assert C.overall([C.HOLDS, C.HOLDS, C.NOT_TESTABLE]) == C.HOLDS
    assert C.overall([C.HOLDS, C.NOT_SEPARATED]) == C.NOT_SEPARATED
    assert C.overall([C.HOLDS, C.CONTRADICTED]) == C.CONTRADICTED
    assert C.overall([C.NOT_TESTABLE]) == C.NOT_TESTABLE
    assert C.overall([]) == C.NOT_TESTABLE


def test_compare_pairs_by_seed_and_takes_the_claimed_direction():
    ours, theirs = {0: 12.0, 1: 14.0, 2: 13.0, 3: 99.0}, {0: 10.0, 1: 11.0, 2: 11.0}
    found = C.compare("F3", "x", "a - b", ours, theirs)
    assert found.effect.n == 3  # seed 3 has no partner
    assert found.effect.mean == pytest.approx((2 + 3 + 2) / 3)
    assert found.verdict == C.HOLDS
    # Fewer rounds is better: the effect is theirs minus ours.
    fast = C.compare("F9", "x", "r", {0: 4, 1: 5}, {0: 9, 1: 9}, lower_is_better=True)
    assert fast.effect.mean == pytest.approx(4.5)


def test_a_setting_that_barely_learns_tests_nothing():
    # Global accuracy of 12-13 % on a 10-class task: the better side is below 5x chance.
    found = C.compare("F7", "cifar10", "g", {0: 12.0, 1: 13.0}, {0: 11.0, 1: 11.5}, chance=10.0)
    assert found.verdict == C.NOT_TESTABLE
    assert "below the 50 % a setting must reach (chance 10 %)" in found.reason
    assert C.learning_threshold(1.0) == 5.0 and C.learning_threshold(50.0) == 75.0
    learnt = C.compare("F7", "cifar10", "g", {0: 62.0, 1: 63.0}, {0: 51.0, 1: 51.5}, chance=10.0)
    assert learnt.verdict == C.HOLDS and learnt.reason == ""


def test_one_seed_or_no_runs_is_not_testable_with_the_reason():
    one = C.compare("F14", "x", "e", {0: 20.0}, {0: 21.0}, kind="no_worse")
    assert (one.verdict, one.reason) == (C.NOT_TESTABLE, "1 paired seed: no interval")
    assert one.effect.mean == pytest.approx(-1.0) and math.isnan(one.effect.ci_low)
    none = C.compare("F14", "x", "e", {}, {0: 21.0})
    assert none.verdict == C.NOT_TESTABLE and "no runs" in none.reason


def _main_frame(seeds=(0, 1, 2)) -> pd.DataFrame:
    rows = []
    accs = {"Local": 60.0, "FedProto": 55.0, "FedTGP": 56.0, "AlignFed": 40.0}
    for seed in seeds:
        noise = 0.1 * seed
        for method, acc in accs.items():
            rows.append((method, acc + noise, acc - 30, acc + 20, seed))
        rows.append(("FedTSP-MiniLM", 58.0 + noise, 20.0, 80.0, seed))
    frame = pd.DataFrame(rows, columns=["method", "best_acc", "global_acc", "best_top5", "seed"])
    return frame.assign(dataset="cifar10", alpha=0.1, family="htfe-cpu", key="k")


def test_main_table_findings_on_a_known_frame():
    main = _main_frame()
    curves = pd.DataFrame(
        [
            {"method": m, "dataset": "cifar10", "alpha": 0.1, "seed": s, "round": r, "acc": acc}
            for m, rounds in (("FedTSP-MiniLM", (30, 50, 58)), ("FedTGP", (20, 40, 56)))
            for s in (0, 1, 2)
            for r, acc in enumerate(rounds)
        ]
    )
    found = {f.claim: f for f in C.main_table(main, main.iloc[:0], curves, {"cifar10": 10.0})}
    assert found["F3"].verdict == C.HOLDS  # +2 over FedTGP on every seed
    assert found["F3"].comparison.startswith("FedTSP-MiniLM - FedTGP")
    assert found["F4"].verdict == C.CONTRADICTED  # Local is 2 points above on every seed
    assert found["F7"].verdict == C.NOT_TESTABLE  # global accuracy 26 %: below 50 %
    assert found["F5"].verdict == C.NOT_TESTABLE and "one alpha" in found["F5"].reason
    # FedTGP's best is 56: target 53.2 %, reached by FedTSP at round 2 and by FedTGP at
    # round 2 too (56 >= 53.2): no difference on any seed.
    assert found["F9"].effect.mean == 0 and found["F9"].unit == "rounds"
    assert "F6" not in found  # no model-family runs


def test_fmcl_findings_name_baselines_that_found_fmcls_clusters():
    rows = []
    for seed in (0, 1):
        rows += [
            ("fmcl", seed, [0, 0, 1, 1], 0.60 + 0.01 * seed, 1.0),
            ("ifca", seed, [1, 1, 0, 0], 0.58 + 0.01 * seed, 1.0),  # same partition, renamed
            ("pacfl", seed, [0, 0, 0, 0], 0.40, 0.0),
            ("fedavg", seed, [0, 0, 0, 0], 0.40 + 0.02 * seed, 0.0),
        ]
    bench = pd.DataFrame(rows, columns=["method", "seed", "assignment", "best_acc", "ari"])
    bench = bench.assign(population="label-groups", key="k", rounds=20, converged=True)
    bench.loc[(bench["method"] == "fedavg") & (bench["seed"] == 1), "converged"] = False
    found = {f.claim: f for f in C.fmcl(bench)}
    assert "same clusters as FMCL on every seed: ifca" in found["M1"].reason
    # FedAvg short of its plateau on one seed: the accuracy part says so, the ARI parts not.
    assert found["M3"].reason == "not converged at 20 rounds"
    assert "not converged" not in found["M1"].reason + found["M2"].reason
    assert found["M1"].effect.mean == pytest.approx(2.0)  # points, fmcl - ifca
    # identical clusterings on every seed: a difference of exactly 0, a well-measured tie
    assert found["M2"].effect.mean == 0 and found["M2"].verdict == C.EQUIVALENT
    assert found["M3"].verdict == C.HOLDS


def test_every_claim_belongs_to_a_notebook_and_ids_are_unique():
    notebooks = {p.stem for p in NOTEBOOKS_DIR.glob("*.ipynb")}
    assert {c.notebook for c in C.CLAIMS} <= notebooks
    assert len(C.BY_ID) == len(C.CLAIMS)
    # The paper's evidence for Table 1 is computed from its numbers, not typed.
    gains = paper_gains()
    assert len(gains) == 9 and f"{min(gains.values()):+.2f}" in C.BY_ID["F3"].evidence


def test_the_report_lists_every_claim_and_keeps_numbers_in_columns(tmp_path):
    (tmp_path / "claims").mkdir()
    findings = [
        C.compare("F3", "cifar10, Dir(0.1)", "a - b", {0: 60.0, 1: 61.0}, {0: 58.0, 1: 58.5}),
        C.compare("F3", "cifar100, Dir(0.1)", "a - b", {0: 26.0, 1: 25.0}, {0: 25.0, 1: 26.0}),
    ]
    C.findings_frame(findings).to_csv(tmp_path / "claims" / "03_main_table.csv", index=False)
    C.write_report(tmp_path, "cpu")
    text = (tmp_path / "claims.md").read_text()
    assert "| F3 | FedTSP |" in text and "not separated" in text
    assert "not run (08_fmcl wrote no findings)" in text
    table = pd.read_csv(tmp_path / "claims.csv")
    assert list(table["claim_verdict"]) == [C.NOT_SEPARATED, C.NOT_SEPARATED]
    assert table["mean"].tolist() == pytest.approx([2.25, 0.0])
    summary = (tmp_path / "claims_summary.md").read_text()
    assert summary.count("\n| ") == len(C.CLAIMS)


def test_the_bottom_line_says_each_verdict_with_its_deciding_parts_from_the_data(tmp_path):
    (tmp_path / "claims").mkdir()
    up = {0: 61.0, 1: 62.0, 2: 61.5}, {0: 58.0, 1: 58.5, 2: 58.2}  # +3.3 points
    down = up[1], up[0]
    findings = [
        C.compare("F3", "cifar10, Dir(0.1)", "a - b", *up),
        C.compare("F3", "cifar100, Dir(0.1)", "a - b", *up, converged=False, rounds=50),
        C.compare("F4", "cifar10, Dir(0.1)", "a - c", *down),
        C.compare("F6", "htfe2-cpu, cifar10", "a - b", *up),
        C.compare("F6", "htfe3-cpu, cifar10", "a - b", {0: 60.0, 1: 50.0, 2: 70.0}, up[1]),
        # Significantly negative, its whole interval inside the 0.05 margin: small.
        C.compare(
            "F2", "c", "x - u", {0: 0.1, 1: 0.2, 2: 0.3}, {0: 0.103, 1: 0.204, 2: 0.302}, unit=""
        ),  # fmt: skip
        # A measured no difference (+0.00 [-0.12, +0.12], margin 1).
        C.compare("F11", "s", "t - u", {0: 1.0, 1: 1.1, 2: 0.9}, {0: 1.0, 1: 1.05, 2: 0.95}),
    ]
    C.findings_frame(C.judge(findings)).to_csv(tmp_path / "claims" / "03.csv", index=False)
    C.write_report(tmp_path, "cpu")
    lines = (tmp_path / "claims_bottom_line.md").read_text().split("\n\n")
    assert lines[0].startswith("At the `cpu` profile's scale (20 rounds x 1 local epoch")
    assert "FMCL's claims: 20 rounds x 1 local epoch, 12 clients, fedavgcnn_s" in lines[0]
    assert (
        f"of {len(C.CLAIMS)} claims: 1 holds, 2 contradicted, 1 equivalent, 1 not separated, "
        in lines[0]
    )
    held = next(line for line in lines if line.startswith("**Hold:**"))
    assert (
        "F3 (FedTSP is more accurate than" in held
        and "a - b +3.27 [+2.64, +3.89] points (n = 3);" in held  # wider than the margin
        and "cifar100, Dir(0.1): a - b +3.27 [+2.64, +3.89] points (n = 3; not converged at 50 rounds)." in held
    )  # fmt: skip
    against = next(line for line in lines if line.startswith("**Contradicted:**"))
    assert "F4 (" in against and "-3.27 [" in against
    assert "c: x - u -0.003 [-0.005, -0.001] (n = 3), the whole interval inside the ± 0.05 margin" in against  # fmt: skip
    assert any(
        line.startswith(
            "**Equivalent (a measured no difference, inside ± the margin: the advantage the "
            "paper claims is not there at this scale):** F11 ("
        )
        for line in lines
    )
    # A claim not separated overall says which of its parts went which way.
    # A claim not separated overall quotes the parts decided either way, and counts the rest.
    assert (
        "F6 (htfe2-cpu, cifar10: a - b +3.27 [+2.64, +3.89] points (n = 3) holds; 1 part not "
        "separated or not testable)" in next(x for x in lines if "Not separated" in x)
    )
    untested = next(line for line in lines if line.startswith("**Not testable here:**"))
    assert "F1 (no runs)" in untested
    text = (tmp_path / "claims.md").read_text()
    assert text.index("## Bottom line") < text.index("**Rule.**") and lines[1] in text


def test_a_sections_reading_says_each_part_and_what_a_reader_could_misread(tmp_path):
    zero = {0: 0.0, 1: 0.0, 2: 0.0}
    lone = {0: 1.0, 1: 1.7, 2: 1.1}  # significant alone, not after Holm (test above)
    findings = C.judge(
        [
            C.compare("F3", "a", "x - y", lone, zero),
            C.compare("F3", "b", "x - y", {0: 5.0, 1: -3.0, 2: 1.0}, zero),
            # Significantly negative, yet the whole interval inside the 0.05 margin.
            C.compare(
                "F2",
                "c",
                "x - u",
                {0: 0.1, 1: 0.2, 2: 0.3},
                {0: 0.103, 1: 0.204, 2: 0.302},
                unit="",
            ),  # fmt: skip
            C.compare("F8", "d", "x - z", {0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0}),  # +1 on both seeds
            C.compare("F9", "e", "x - w", {}, zero),
        ]
    )
    text = C.section_reading(findings, ["F3", "F2", "F8", "F9", "F1"])
    assert text.startswith("**Reading.** **F3** (FedTSP is more accurate than")
    assert (
        "**not separated**, these seeds, Holm-corrected within the claim, decide it neither way."
        in text
    )
    assert "- a: x - y +1.27 [" in text and "(n = 3): not separated (p = 0.029 alone, 0.057 after Holm within the claim)" in text  # fmt: skip
    assert "**F2** (" in text and "**contradicted**, the data go against the paper here." in text
    assert "c: x - u -0.003 [" in text and "inside ± 0.05, so the difference is small" in text
    assert "all 2 seeds gave the same difference, so the interval has no width" in text
    assert "- e: x - w: not testable here (no runs of the claimed side)" in text
    assert "**F1**: no findings (no runs at this profile)." in text


def test_holm_adjusts_in_step_down_order():
    assert C.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert C.holm([0.5]) == [0.5]


def test_holm_within_a_claim_can_turn_a_lone_significant_part_into_not_separated():
    # Each part alone holds (its 95 % interval excludes 0), but barely.
    lone = {0: 1.0, 1: 1.7, 2: 1.1}, {0: 0.0, 1: 0.0, 2: 0.0}
    one = C.compare("F3", "a", "x", *lone)
    assert one.verdict == C.HOLDS and one.p_holm < C.ALPHA
    weak = [one, C.compare("F3", "b", "x", {0: 5.0, 1: -3.0, 2: 1.0}, lone[1])]
    judged = C.judge(weak)
    assert judged[0].p_holm == pytest.approx(2 * one.p_holm)
    assert one.p_holm == pytest.approx(0.0286, abs=1e-3)  # t = 5.79 on 2 df
    assert judged[0].verdict == C.NOT_SEPARATED  # 0.057 after Holm over two parts
    # A part of another claim is not in the family.
    other = C.judge([one, C.compare("F4", "b", "x", {0: 5.0, 1: -3.0, 2: 1.0}, lone[1])])
    assert other[0].p_holm == pytest.approx(one.p_holm)


def test_a_part_within_the_margin_of_the_label_prior_is_not_testable():
    ours, theirs = {0: 80.0, 1: 81.0, 2: 80.5}, {0: 78.0, 1: 79.0, 2: 78.4}
    near = C.compare("F3", "c10", "x", ours, theirs, floor=77.0)
    assert near.verdict == C.NOT_TESTABLE
    assert "within 5 points of the label prior (77.0 %)" in near.reason
    clear = C.compare("F3", "c10", "x", ours, theirs, floor=70.0)
    assert clear.verdict == C.HOLDS


def test_a_top_k_part_at_the_ceiling_is_not_testable():
    found = C.compare("F8", "c10", "x", {0: 99.5, 1: 99.6}, {0: 99.4, 1: 99.5}, ceiling=95.0)
    assert found.verdict == C.NOT_TESTABLE and "95 % ceiling" in found.reason


def test_unconverged_runs_keep_their_verdict_but_say_so_and_fail_a_balanced_test():
    ours, theirs = {0: 62.0, 1: 63.0, 2: 62.5}, {0: 51.0, 1: 51.5, 2: 51.2}
    local = C.compare("F3", "x", "y", ours, theirs, converged=False, rounds=20)
    assert local.verdict == C.HOLDS and local.reason == "not converged at 20 rounds"
    balanced = C.compare("F7", "x", "y", ours, theirs, chance=10.0, converged=False, rounds=20)
    assert balanced.verdict == C.NOT_TESTABLE
    assert (
        balanced.reason == "not converged at 20 rounds (a balanced test set needs converged runs)"
    )


def test_context_reads_floors_and_plateaus_from_a_runs_frame():
    frame = pd.DataFrame(
        {
            "method": ["A", "A", "B", "B"],
            "seed": [0, 1, 0, 1],
            "label_prior": [70.0, 72.0, 70.0, 72.0],
            "label_prior_top5": [99.0, 99.0, 99.0, 99.0],
            "converged": [True, True, True, False],
            "rounds": [20, 20, 20, 20],
        }
    )
    assert C.context(frame, "best_acc", method=["A", "B"]) == {
        "floor": 71.0,
        "converged": False,
        "rounds": 20,
    }
    top5 = C.context(frame, "best_top5", method="A")
    assert top5 == {"floor": 99.0, "ceiling": 95.0, "converged": True, "rounds": 20}


def test_derived_numbers_are_written_at_the_stated_precision():
    from fedtsp.paper.tables import to_csv

    # 0.1 + 0.2 and 0.3 differ in the last bit, as sums taken in another order do.
    frame = pd.DataFrame({"x": [0.1 + 0.2, 0.3, 1 / 3, 12345.678901234], "n": [1, 2, 3, 4]})
    assert to_csv(frame).splitlines() == [
        "x,n",
        "0.3,1",
        "0.3,2",
        "0.3333333333,3",
        "12345.6789,4",
    ]


def test_the_controls_table_gives_each_control_its_holm_corrected_f11_verdict():
    # Row (2) is 2 points above "random" on every seed and 0.25 (sd 0.125) above "shuffled".
    rows = [notebook_runs.LOCAL_ROW, *(row for row, _, _ in notebook_runs.ABLATION_ROWS)]
    table2 = pd.DataFrame(
        [(r, s, 30.0 + i + 0.25 * s) for i, r in enumerate(rows) for s in (0, 1, 2)],
        columns=["row", "seed", "best_acc"],
    ).assign(text_encoder="minilm", dataset="cifar100", label_prior=10.0, converged=True)
    text = {s: 31.0 + 0.25 * s for s in (0, 1, 2)}
    controls = pd.DataFrame(
        [("random", s, text[s] - 2.0) for s in (0, 1, 2)]
        + [("shuffled", s, text[s] - d) for s, d in ((0, 0.125), (1, 0.25), (2, 0.375))],
        columns=["control", "seed", "best_acc"],
    ).assign(text_encoder="minilm", dataset="cifar100", label_prior=10.0, converged=True)
    findings = C.ablations(table2, controls, table2.iloc[:0], rows)
    table, numbers = C.controls_table(findings, table2, controls, rows[1])
    f11 = [f for f in findings if f.claim == "F11"]
    assert list(table["verdict"]) == [f.verdict for f in f11] == [C.HOLDS, C.EQUIVALENT]
    assert list(table["targets"]) == ["random", "shuffled"]
    assert table["text - control [95 % CI]"].iloc[0] == "+2.00 [+2.00, +2.00]"  # no spread
    assert table["text - control [95 % CI]"].iloc[1] == "+0.25 [-0.06, +0.56]"
    assert list(numbers["p_holm"]) == [f.p_holm for f in f11]
    assert numbers["difference_mean"].tolist() == pytest.approx([2.0, 0.25])
    # The section's reading: a claim whose parts hold and are equivalent is not separated
    # overall, and says why, not that the seeds cannot tell.
    reading = C.section_reading(findings, ["F11"]).splitlines()
    assert reading[0].endswith("**not separated**, its parts point different ways.")
    assert reading[1:] == [
        "- minilm, cifar100: (2) text - random targets +2.00 [+2.00, +2.00] points (n = 3): "
        "holds (all 3 seeds gave the same difference, so the interval has no width)",
        "- minilm, cifar100: (2) text - shuffled targets +0.25 [-0.06, +0.56] points (n = 3): "
        "equivalent",
    ]


def test_each_fedtsp_is_compared_with_its_own_encoders_untrained_prototypes():
    rows = [
        (m, s, rho + 0.01 * s)
        for s in (0, 1, 2)
        for m, rho in (("FedTSP-CLIP", 0.60), ("FedTSP-BERT", 0.50), ("FedProto", 0.20))
    ]
    sem = pd.DataFrame(rows, columns=["method", "seed", "rho"]).assign(
        gap=0.1, dataset="cifar10", key="k"
    )
    untrained = {
        ("cifar10", "FedTSP-CLIP"): {"rho": 0.55, "gap": 0.1},
        ("cifar10", "FedTSP-BERT"): {"rho": 0.70, "gap": 0.1},
    }
    found = {
        f.comparison: f
        for f in C.semantics(sem, untrained)
        if f.claim == "F1" and "untrained" in f.comparison
    }
    assert found["FedTSP-CLIP - its untrained text prototypes"].effect.mean == pytest.approx(0.06)
    assert found["FedTSP-BERT - its untrained text prototypes"].effect.mean == pytest.approx(-0.19)


def test_the_authors_runs_are_judged_within_the_margin_per_dataset():
    """F17: a 0.2-point difference with little spread lies inside ± 1 point (holds); a
    3-point drop lies wholly outside it (contradicted); the table and its reading say so,
    each dataset with its own number of paired seeds."""
    authors, paper = notebook_runs.AUTHORS_RUNS
    spread = [0.1, -0.1, 0.05, -0.05, 0.0, 0.02]
    rows = []
    for ds, shift, seeds in (("cifar10", 0.2, 6), ("cifar100", -3.0, 5)):
        for seed, noise in enumerate(spread[:seeds]):
            rows.append({"dataset": ds, "method": paper, "seed": seed, "best_acc": 50.0 + seed})
            rows.append(
                {"dataset": ds, "method": authors, "seed": seed,
                 "best_acc": 50.0 + seed + shift + noise}
            )  # fmt: skip
    runs = pd.DataFrame(rows)
    findings = C.authors_runs(runs)
    assert [(f.scope, f.kind, f.verdict) for f in findings] == [
        ("cifar10", "within", C.HOLDS),
        ("cifar100", "within", C.CONTRADICTED),
    ]
    assert findings[0].effect.mean == pytest.approx(0.2 + sum(spread) / 6)
    table, numbers = C.authors_table(findings, runs, notebook_runs.AUTHORS_RUNS)
    assert list(table["dataset"]) == ["cifar10", "cifar100"]
    assert table.loc[1, f"{paper} (%)"].startswith("52.00 ±")
    assert list(table["seeds paired"]) == [6, 5]
    assert numbers.loc[1, "difference_mean"] == pytest.approx(-3.0 + sum(spread[:5]) / 5)
    reading = C.authors_reading(table)
    assert "cifar10 +0.2" in reading and "over 6 paired seeds (holds)" in reading
    assert "over 5 paired seeds (contradicted)" in reading


def _profile_claims(root, profile, findings):
    folder = root / profile
    (folder / "claims").mkdir(parents=True)
    C.findings_frame(C.judge(findings)).to_csv(folder / "claims" / "03.csv", index=False)
    C.write_report(folder, profile)


def test_claims_against_another_profile_say_which_verdicts_moved_and_why(tmp_path, capsys):
    from fedtsp.cli import main

    few = {0: 60.0, 1: 61.5, 2: 60.2}, {0: 59.0, 1: 61.0, 2: 60.4}  # n = 3, not separated
    more = (
        {s: 61.0 + 0.1 * s + 0.2 * (-1) ** s for s in range(8)},
        {s: 59.5 + 0.1 * s for s in range(8)},
    )
    _profile_claims(tmp_path, "cpu", [
        C.compare("F3", "cifar10, Dir(0.1)", "FedTSP-MiniLM - FedTGP (strongest of 3)", *few),
        C.compare("F4", "cifar10, Dir(0.1)", "FedTSP-MiniLM - Local (strongest of 11)", *few),
        C.compare("F6", "htfe2-cpu, cifar10", "FedTSP-MiniLM - FedTGP (strongest of 3)", *few),
    ])  # fmt: skip
    _profile_claims(tmp_path, "evidence", [
        C.compare("F3", "cifar10, Dir(0.1)", "FedTSP-MiniLM - FedTGP", *more),  # planned
        C.compare("F4", "cifar10, Dir(0.1)", "FedTSP-MiniLM - Local (strongest of 11)", *few),
        C.compare("F6", "htfe2-cpu, cifar10", "FedTSP-MiniLM - FedProto", *more),
    ])  # fmt: skip
    args = ["claims", "--results", str(tmp_path), "--profile", "evidence", "--against", "cpu"]
    assert main(args) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "2 of 20 claims changed verdict; 1 parts tested on both sides changed theirs." in text
    assert "| F3 | FedTSP is more accurate than" in text
    assert "| not separated | holds | yes |" in text
    # How the rival was chosen is not the part's identity; the rival is.
    (moved,) = [line for line in lines if line.startswith("| F3 | cifar10")]
    assert moved == (
        "| F3 | cifar10, Dir(0.1): FedTSP-MiniLM - FedTGP "
        "| not separated: +0.43 [-1.06, +1.93] points (n = 3) "
        "| holds: +1.50 [+1.32, +1.68] points (n = 8) "
        "| seeds 3 → 8; rival the strongest of 3 → named in advance; "
        "interval ± 1.50 → ± 0.18 |"
    )
    alone = [line for line in lines if line.startswith("| F6 | htfe2-cpu")]
    assert [line.split(" | ")[1:3] for line in alone] == [
        ["htfe2-cpu, cifar10: FedTSP-MiniLM - FedTGP", "cpu"],
        ["htfe2-cpu, cifar10: FedTSP-MiniLM - FedProto", "evidence"],
    ]
    assert not any(line.startswith("| F4 | cifar10") for line in lines)  # same verdict
    assert main(["claims", "F4", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| F4 | cifar10, Dir(0.1): FedTSP-MiniLM - Local (strongest of 11) |" in out
    assert main(["claims", "F99", "--results", str(tmp_path)]) == 2
    assert main(["claims", "--results", str(tmp_path), "--against", "cpu"]) == 2
    assert main(["claims", "--results", str(tmp_path), "--profile", "paper"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert errors[0].startswith("fedtsp: error: unknown claim 'F99'; choose from F1, F2,")
    assert errors[1] == (
        "fedtsp: error: --against cpu names --profile itself; name another profile"
    )
    assert errors[2].endswith(
        "profile 'paper' has no claims yet; run `fedtsp reproduce --profile paper` first"
    )

"""The HtFLlib side-by-side script: log parsing, the verdict rule, its committed table, and
bad input caught before any work (HtFLlib itself is not run here)."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, load_script

from fedtsp.paper.statistics import summarize

sbs = load_script("audits/htfllib_side_by_side")
RESULTS = REPO / "benchmarks" / "results"


def _log(accs: list[float], times: list[float], finished: bool = True) -> str:
    lines = ["algorithm = Local"]
    for i, (acc, t) in enumerate(zip(accs, times, strict=True)):
        lines += [f"-------------Round number: {i}-------------", f"Averaged Test Accurancy: {acc}"]
        lines.append(f"{'-' * 25} time cost {'-' * 25} {t}")
    if finished:
        lines += ["Best accuracy.", str(max(accs))]
    return "\n".join(lines)


def test_an_htfllib_log_gives_best_accuracy_and_seconds_per_round_without_the_first():
    parsed = sbs.parse_htfllib(_log([0.1, 0.45, 0.5], [9.0, 2.0, 4.0]))
    assert parsed["best_acc"] == pytest.approx(50.0)
    assert parsed["accs"] == [10.0, 45.0, 50.0]
    assert parsed["s_per_round"] == pytest.approx(3.0)  # round 0's set-up time left out
    with pytest.raises(RuntimeError, match="did not finish"):
        sbs.parse_htfllib(_log([0.1, 0.2], [1.0, 1.0], finished=False))


def test_identical_repeats_never_read_0_00():
    assert "(n = 3, all equal)" in sbs._pm([45.3, 45.3, 45.3])
    assert "0.00" not in sbs._pm([45.3, 45.3, 45.3])


COMMITTED = sorted(p.name for p in RESULTS.glob("htfllib_side_by_side*.json"))


def test_the_main_comparison_is_committed():
    assert "htfllib_side_by_side.json" in COMMITTED


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_tables_are_regenerated_from_their_json_and_follow_the_rule(name):
    results = json.loads((RESULTS / name).read_text())
    assert (RESULTS / name).with_suffix(".md").read_text() == sbs.table(results)
    assert results["setting"]["seeds"] == [0, 1, 2]
    for label, res in results["methods"].items():
        if "difference" not in res:  # HtFLlib failed: the table says so
            assert res["htfllib"]["errors"], label
            continue
        s1, s2 = (summarize(res[k]["best_acc"]) for k in ("ours", "htfllib"))
        (m1, s1), (m2, s2) = (s1.mean, s1.std), (s2.mean, s2.std)
        assert res["difference"] == pytest.approx(m1 - m2)
        assert res["tolerance"] == pytest.approx(max(1.5, 2 * max(s1, s2)))
        assert res["within"] == (abs(m1 - m2) <= res["tolerance"])


def test_a_row_needing_another_htfllib_commit_fails_in_one_line_before_any_work(tmp_path, capsys):
    (tmp_path / "system").mkdir()
    (tmp_path / "system" / "main.py").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        sbs.main(["--htfllib", str(tmp_path), "--methods", "FD, softmax target"])
    assert exit_info.value.code == 2
    assert "--htfllib-tree 6e6f1ae DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sbs.main(["--htfllib", str(tmp_path / "nothing")])
    assert "no system/main.py" in capsys.readouterr().err


def test_the_protocol_table_sets_each_method_under_each_protocol_beside_htfllib():
    def results(ours: list[float], theirs: list[float], extra: bool = False) -> dict:
        row = {"ours": {"best_acc": ours}, "htfllib": {"best_acc": theirs, "errors": []}}
        return {"methods": {"FedGH": row, **({"FML": row} if extra else {})}}

    by_protocol = {
        "fedtsp": results([54.0, 55.0, 56.0], [45.0, 45.5, 46.0]),
        "htfllib": results([47.0, 48.0, 49.0], [45.0, 45.5, 46.0], extra=True),
    }
    lines = sbs.protocol_table(by_protocol).splitlines()
    assert lines[0] == "| method | fedtsp, htfllib protocol | fedtsp, fedtsp protocol | HtFLlib |"
    assert lines[2] == "| FedGH | 48.00 ± 1.00 | 55.00 ± 1.00 | 45.50 ± 0.50 |"
    assert lines[3] == "| FML | 48.00 ± 1.00 | - | 45.50 ± 0.50 |"  # not run under fedtsp's


def test_the_committed_protocol_table_is_regenerated_from_the_committed_json():
    measured = {
        name: json.loads(sbs.results_file(RESULTS, name).read_text())
        for name in sbs.PROTOCOLS
        if sbs.results_file(RESULTS, name).exists()
    }
    assert {"htfllib", "fedtsp"} <= set(measured)
    for name, results in measured.items():
        for field, value in sbs.PROTOCOLS[name].items():
            # A run made before a field existed ran at its default, which is fedtsp's.
            default = sbs.PROTOCOLS["fedtsp"][field]
            assert results["setting"].get(field, default) == value, (name, field)
    expected = sbs.protocol_table(measured)
    assert (RESULTS / "htfllib_side_by_side_protocols.md").read_text() == expected


def test_the_table_names_the_fedtsp_code_of_each_row_once():
    def row(commits: list[str]) -> dict:
        ours = {"best_acc": [50.0, 51.0], "s_per_round": 1.0, "commits": commits}
        theirs = {"best_acc": [50.0, 50.5], "s_per_round": 2.0, "errors": []}
        return {"ours": ours, "htfllib": theirs, "difference": 0.25, "tolerance": 1.5}

    results = {
        "setting": {"num_clients": 20, "undersized_clients": "skip"},
        "departures": {},
        "methods": {
            "Local": row(["f7854ea", "f7854ea"]),
            "FML": row(["3bd5026", "3bd5026"]),
            "FedGH": row(["f7854ea", "f7854ea"]),
        },
    }
    for res in results["methods"].values():
        res["within"] = True
    last = sbs.table(results).splitlines()[-1]
    assert last == "fedtsp code of our runs: f7854ea for Local / FedGH; 3bd5026 for FML."


@pytest.mark.parametrize(
    ("marker", "name"),
    [("main", "htfllib_side_by_side.md"), ("protocols", "htfllib_side_by_side_protocols.md")],
)
def test_the_readme_shows_the_committed_tables(marker, name):
    readme = (REPO / "docs" / "baselines.md").read_text()
    start, end = f"<!-- side-by-side:{marker} -->\n", f"<!-- /side-by-side:{marker} -->"
    shown = readme[readme.index(start) + len(start) : readme.index(end)]
    assert shown == (RESULTS / name).read_text()

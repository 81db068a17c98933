"""The code-metrics script: what counts as a code line, a round loop, a function-level import
and a repeated block (HtFLlib is not read here)."""

from __future__ import annotations

import ast
import textwrap

from conftest import REPO, load_script

cm = load_script("code_metrics")

SOURCE = textwrap.dedent(
    '''\
    """Module docstring,
    two lines."""
    from typing import TYPE_CHECKING

    if TYPE_CHECKING:
        import numpy

    # a comment


    def run(cfg):
        """A function docstring."""
        import torch  # counted: inside a function

        total = (1 +
                 2)
        for t in range(cfg.rounds + 1):
            total += t
        for i in range(3):
            total += i
        return total
    '''
)


def test_code_lines_leave_out_blank_comment_and_docstring_lines():
    # 3 import, 5-6 if/import, 11 def, 13 import, 15-16 one statement, 17-20 loops, 21 return
    assert cm.code_line_numbers(SOURCE) == [3, 5, 6, 11, 13, 15, 16, 17, 18, 19, 20, 21]


def test_round_loops_and_function_imports_are_found_where_they_are():
    tree = ast.parse(SOURCE)
    assert cm.round_loops(tree) == [17]  # range(3) is no round loop
    assert cm.function_imports(tree) == [(13, "torch")]  # the TYPE_CHECKING import is not


def test_a_repeated_run_is_counted_once_at_its_full_length():
    block = "\n".join(f"x{i} = f({i})" for i in range(8))
    a = f"def one():\n{textwrap.indent(block, '    ')}\n    return 1\n"
    b = f"y = 0\n{block}\nz = 2\n"
    short = "\n".join(f"x{i} = f({i})" for i in range(5))  # 5 lines: below the minimum
    blocks = cm.repeated_blocks({"a.py": a, "b.py": b, "c.py": short})
    assert blocks == [{"lines": 8, "a": "a.py:2-9", "b": "b.py:2-9"}]
    assert cm.repeated_blocks({"a.py": a}) == []


def test_an_upward_import_is_found_and_the_package_has_none():
    trees = {
        "fedtsp/algorithms/x.py": ast.parse(
            "from fedtsp.engine.simulation import run_experiment\n"
        ),
        "fedtsp/data/y.py": ast.parse("from fedtsp import core, paper\nimport fedtsp.models\n"),
        "fedtsp/core/config.py": ast.parse(
            "def f():\n    from fedtsp import cli\n"
        ),  # in a function
    }
    assert cm.upward_imports(trees) == [
        "fedtsp/algorithms/x.py:1 imports fedtsp.engine",
        "fedtsp/data/y.py:1 imports fedtsp.paper",
    ]
    package = {
        str(p.relative_to(REPO)): ast.parse(p.read_text()) for p in (REPO / "fedtsp").rglob("*.py")
    }
    assert cm.upward_imports(package) == []
    units = {p.stem if p.is_file() else p.name for p in (REPO / "fedtsp").iterdir()}
    units = {u for u in units if not u.startswith((".", "_")) or u in ("__init__", "__main__")}
    placed = {u for layer in cm.LAYERS.values() for u in layer}
    code = {
        u
        for u in units
        if (REPO / "fedtsp" / f"{u}.py").exists() or (REPO / "fedtsp" / u / "__init__.py").exists()
    }
    assert code <= placed, f"units in no layer: {sorted(code - placed)}"


def test_a_loop_that_runs_one_round_per_step_is_a_round_loop():
    tree = ast.parse(
        "for t in range(a, b):\n    row = loop.round(t)\nfor i in range(3):\n    f(i)\n"
    )
    assert cm.round_loops(tree) == [1]


def test_the_before_and_after_table_renders_a_missing_measure_as_not_measured():
    before = {
        "code_version": "aaa",
        "round_loops": {"count": 5},
        "methods_ratio_overall": 0.64,
        "repeated_blocks": {"count": 4},
        "function_level_imports": {"count": 78},
        "largest_modules": [{"module": "x.py", "code_lines": 845}],
        "modules": 71,
        "package_code_lines": 10991,
    }
    after = before | {"code_version": "bbb", "round_loops": {"count": 1}}
    after |= {"upward_imports": {"count": 0}}
    lines = cm.change_table(before, after).splitlines()
    assert lines[0] == "| measure | before (aaa) | after (bbb) |"
    assert "| round loops | 5 | 1 |" in lines
    assert "| module-level imports of a higher layer | not measured | 0 |" in lines


def test_option_lines_count_only_the_options_classes_code():
    source = (
        "import x\n\n"
        "@dataclass\nclass FedXOptions:\n"
        '    """Docstring: not code."""\n\n'
        "    lam: float = option(1.0, 'weight')  # a comment\n"
        "    tau: float = option(\n        0.5, 'temperature'\n    )\n\n"
        "class FedX:\n    name = 'x'\n"
    )
    # The decorator sits outside the class node; the class line, lam (1) and tau (3) count.
    assert cm.option_lines(source) == 5
    assert cm.option_lines("class FedX:\n    pass\n") == 0

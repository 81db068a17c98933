"""The engine's shape in numbers: round loops, method-file sizes beside HtFLlib, repeats,
function-level imports, the largest modules.

    python benchmarks/code_metrics.py [--htfllib <HtFLlib checkout>] [--out benchmarks/results]
        [--stem code_metrics]

Code lines are the lines that hold code: blank lines, comment lines and docstrings do not
count. A method's HtFLlib size is its client file plus its server file
(``system/flcore/{clients,servers}/``); without ``--htfllib`` that column stays empty. A round
loop is a ``for`` over ``range(...)`` whose bounds name the rounds or whose body calls a
``round``. Repeated blocks are runs
of six or more code lines that stand in two places identically once indentation is folded
(import statements left out); a run that repeats a longer one is not counted again. A
function-level import is an import inside a function body, outside ``if TYPE_CHECKING``.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from collections import defaultdict
from pathlib import Path
from typing import Any

from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import code_version, short_commit

PACKAGE = REPO_ROOT / "fedtsp"
# Our method file -> HtFLlib's client and server file stems, for the methods both have.
HTFLLIB_METHODS = {
    "local": ("clientlocal", "serverlocal"),
    "fedproto": ("clientproto", "serverproto"),
    "fedtgp": ("clienttgp", "servertgp"),
    "fedgh": ("clientgh", "servergh"),
    "fedgen": ("clientgen", "servergen"),
    "lgfedavg": ("clientlg", "serverlg"),
    "fml": ("clientfml", "serverfml"),
    "feddistill": ("clientfd", "serverfd"),
    "fedkd": ("clientkd", "serverkd"),
    "fedmrl": ("clientmrl", "servermrl"),
}
MIN_REPEAT = 6
# The package's layers, lowest first: a module-level import may only name its own layer or a
# lower one (the README's architecture table shows the same list).
LAYERS = {
    "leaves": ("core",),
    "data, models, text": ("data", "models", "text"),
    "methods": ("algorithms",),
    "engine": ("engine",),
    "paper workflow": ("paper",),
    "entry points": ("cli", "catalogue", "__init__", "__main__"),
}


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_line_numbers(source: str) -> list[int]:
    """Line numbers (1-based) that hold code: not blank, not only a comment, not a docstring."""
    skip = _docstring_lines(ast.parse(source))
    code: set[int] = set()
    ignored = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in ignored or tok.type == tokenize.ENDMARKER:
            continue
        code.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in skip)
    return sorted(code)


def code_lines(path: Path) -> int:
    return len(code_line_numbers(path.read_text()))


def option_lines(source: str) -> int:
    """Code lines of the ``*Options`` classes: the method's declared hyperparameters, whose
    HtFLlib counterpart is the argparse block of its ``main.py``, outside the counted files."""
    code = set(code_line_numbers(source))
    spans = [
        set(range(node.lineno, node.end_lineno + 1))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Options")
    ]
    return len(code & set().union(*spans))


def round_loops(tree: ast.AST) -> list[int]:
    """Lines of ``for ... in range(...)`` loops whose bounds mention the rounds."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.For):
            continue
        it = node.iter
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "tqdm":
            it = it.args[0] if it.args else it
        is_range = isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
        if not (is_range and it.func.id == "range"):
            continue
        # A loop over rounds names them in its bounds, or runs one round per step.
        calls = [
            ast.unparse(c.func).rsplit(".", 1)[-1]
            for stmt in node.body
            for c in ast.walk(stmt)
            if isinstance(c, ast.Call)
        ]
        if "round" in ast.unparse(it).lower() or "round" in calls:
            found.append(node.lineno)
    return found


def function_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, modules) of every import statement in a function, outside ``if TYPE_CHECKING``."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if in_function and isinstance(child, ast.Import):
                found.append((child.lineno, ", ".join(alias.name for alias in child.names)))
            elif in_function and isinstance(child, ast.ImportFrom):
                found.append((child.lineno, "." * child.level + (child.module or "")))
            visit(child, inside)

    visit(tree, False)
    return found


def _top(module: str) -> str | None:
    """The package's top-level unit a module name belongs to (None: not this package)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "fedtsp" and len(parts) > 1 else None


def upward_imports(trees: dict[str, ast.AST]) -> list[str]:
    """Module-level imports of a higher layer than the importing module's (see LAYERS)."""
    rank = {unit: i for i, units in enumerate(LAYERS.values()) for unit in units}
    found = []
    for name, tree in trees.items():
        parts = Path(name).with_suffix("").parts  # fedtsp/<unit>[/...]
        own = rank.get(parts[1])
        for node in tree.body:  # function-level imports are counted on their own
            if isinstance(node, ast.ImportFrom) and node.module == "fedtsp":
                units = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                units = [_top(node.module)]
            elif isinstance(node, ast.Import):
                units = [_top(alias.name) for alias in node.names]
            else:
                continue
            for unit in units:
                if own is not None and rank.get(unit, -1) > own:
                    found.append(f"{name}:{node.lineno} imports fedtsp.{unit}")
    return sorted(found)


def repeated_blocks(files: dict[str, str], size: int = MIN_REPEAT) -> list[dict[str, Any]]:
    """Maximal runs of >= ``size`` identical code lines (indentation folded) in two places."""
    lines: dict[str, list[tuple[int, str]]] = {}
    for name, source in files.items():
        text = source.splitlines()
        imports = {
            n
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Import | ast.ImportFrom)
            for n in range(node.lineno, node.end_lineno + 1)
        }
        keep = []
        for n in code_line_numbers(source):
            line = " ".join(text[n - 1].split())
            if n not in imports and len(line) > 1:
                keep.append((n, line))
        lines[name] = keep
    windows: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for name, keep in lines.items():
        for i in range(len(keep) - size + 1):
            windows[tuple(line for _, line in keep[i : i + size])].append((name, i))
    pairs = {
        (*a, *b)
        for places in windows.values()
        for i, a in enumerate(places)
        for b in places[i + 1 :]
        if a[0] != b[0] or abs(a[1] - b[1]) >= size  # a run overlapping itself is no repeat
    }
    blocks = []
    for fa, ia, fb, ib in sorted(pairs):
        if (fa, ia - 1, fb, ib - 1) in pairs:
            continue  # inside a run that starts earlier
        extra = 0
        while (fa, ia + extra + 1, fb, ib + extra + 1) in pairs:
            extra += 1
        la, lb = lines[fa], lines[fb]
        blocks.append(
            {
                "lines": size + extra,
                "a": f"{fa}:{la[ia][0]}-{la[ia + size + extra - 1][0]}",
                "b": f"{fb}:{lb[ib][0]}-{lb[ib + size + extra - 1][0]}",
            }
        )
    return sorted(blocks, key=lambda b: (-b["lines"], b["a"]))


def measure(package: Path, htfllib: Path | None) -> dict[str, Any]:
    files = {str(p.relative_to(package.parent)): p.read_text() for p in package.rglob("*.py")}
    trees = {name: ast.parse(source) for name, source in files.items()}
    sizes = {name: len(code_line_numbers(source)) for name, source in files.items()}
    loops = [f"{name}:{n}" for name, tree in trees.items() for n in round_loops(tree)]
    imports = [
        f"{name}:{n} {module}"
        for name, tree in trees.items()
        for n, module in function_imports(tree)
    ]
    methods = {}
    for ours, (client, server) in HTFLLIB_METHODS.items():
        name = f"fedtsp/algorithms/{ours}.py"
        row: dict[str, Any] = {"fedtsp": sizes[name], "options": option_lines(files[name])}
        if htfllib is not None:
            flcore = htfllib / "system" / "flcore"
            row["htfllib"] = code_lines(flcore / "clients" / f"{client}.py") + code_lines(
                flcore / "servers" / f"{server}.py"
            )
            row["ratio"] = round(row["fedtsp"] / row["htfllib"], 3)
        methods[ours] = row
    total_ours = sum(r["fedtsp"] for r in methods.values())
    total_options = sum(r["options"] for r in methods.values())
    overall = without_options = None
    if htfllib is not None:
        total_theirs = sum(r["htfllib"] for r in methods.values())
        overall = round(total_ours / total_theirs, 3)
        without_options = round((total_ours - total_options) / total_theirs, 3)
    repeats = repeated_blocks(files)
    upward = upward_imports(trees)
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    return {
        "what": "code lines (no blank, comment or docstring lines) of the fedtsp package",
        "code_version": short_commit(code_version()),
        "round_loops": {"count": len(loops), "where": sorted(loops)},
        "methods": methods,
        "methods_ratio_overall": overall,
        "methods_ratio_without_options": without_options,
        "repeated_blocks": {"count": len(repeats), "min_lines": MIN_REPEAT, "blocks": repeats},
        "function_level_imports": {"count": len(imports), "where": sorted(imports)},
        "upward_imports": {"count": len(upward), "where": upward},
        "largest_modules": [{"module": m, "code_lines": n} for m, n in largest],
        "package_code_lines": sum(sizes.values()),
        "modules": len(files),
    }


def _ratio(metrics: dict[str, Any], key: str = "methods_ratio_overall") -> str:
    value = metrics.get(key, "not measured")
    return value if isinstance(value, str) else "-" if value is None else f"{value:.2f}x"


def table(metrics: dict[str, Any]) -> str:
    largest = metrics["largest_modules"][0]
    rows = [
        "| measure | value |",
        "|---|---|",
        f"| round loops | {metrics['round_loops']['count']} |",
        f"| method files / HtFLlib client + server (10 methods) | {_ratio(metrics)} |",
        f"| the same without the Options classes | "
        f"{_ratio(metrics, 'methods_ratio_without_options')} |",
        f"| repeated blocks of >= {MIN_REPEAT} identical code lines | "
        f"{metrics['repeated_blocks']['count']} |",
        f"| function-level imports | {metrics['function_level_imports']['count']} |",
        f"| module-level imports of a higher layer | {metrics['upward_imports']['count']} |",
        f"| largest module | {largest['module']} ({largest['code_lines']} code lines) |",
        f"| package | {metrics['modules']} modules, {metrics['package_code_lines']} code lines |",
        "",
        "| method | fedtsp | of which Options | HtFLlib | ratio |",
        "|---|---|---|---|---|",
    ]
    for name, row in metrics["methods"].items():
        theirs = row.get("htfllib", "-")
        share = f"{row['ratio']:.2f}" if "ratio" in row else "-"
        rows.append(f"| {name} | {row['fedtsp']} | {row['options']} | {theirs} | {share} |")
    return "\n".join(rows) + f"\n\nfedtsp code {metrics['code_version']}.\n"


def change_table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The engine's shape before and after a change, side by side (Markdown)."""

    def row(name: str, value: Any) -> str:
        return f"| {name} | {value(before)} | {value(after)} |"

    def largest(m: dict[str, Any]) -> str:
        top = m["largest_modules"][0]
        return f"{top['module']} ({top['code_lines']})"

    return (
        "\n".join(
            [
                f"| measure | before ({before['code_version']}) | after ({after['code_version']}) |",
                "|---|---|---|",
                row("round loops", lambda m: m["round_loops"]["count"]),
                row("method files / HtFLlib client + server (10 methods)", _ratio),
                row(
                    "the same without the Options classes",
                    lambda m: _ratio(m, "methods_ratio_without_options"),
                ),
                row(
                    f"repeated blocks of >= {MIN_REPEAT} identical code lines",
                    lambda m: m["repeated_blocks"]["count"],
                ),
                row("function-level imports", lambda m: m["function_level_imports"]["count"]),
                row(
                    "module-level imports of a higher layer",
                    lambda m: m.get("upward_imports", {}).get("count", "not measured"),
                ),
                row("largest module (code lines)", largest),
                row(
                    "package modules / code lines",
                    lambda m: f"{m['modules']} / {m['package_code_lines']}",
                ),
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--htfllib", help="HtFLlib checkout (holds system/flcore)")
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results"))
    parser.add_argument("--htfllib-version", help="its commit, recorded with the numbers")
    parser.add_argument("--stem", default="code_metrics", help="output file names, .json / .md")
    parser.add_argument(
        "--baseline", help="an earlier run's JSON: also write <stem>_change.md, before and after"
    )
    args = parser.parse_args(argv)
    htfllib = Path(args.htfllib) if args.htfllib else None
    if htfllib is not None and not (htfllib / "system" / "flcore").is_dir():
        parser.error(f"--htfllib {htfllib}: no system/flcore there (an HtFLlib checkout?)")
    metrics = measure(PACKAGE, htfllib)
    metrics["htfllib"] = args.htfllib_version if htfllib is not None else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.stem}.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (out / f"{args.stem}.md").write_text(table(metrics))
    print(table(metrics))
    if args.baseline:
        before = json.loads(Path(args.baseline).read_text())
        (out / f"{args.stem}_change.md").write_text(change_table(before, metrics))
        print(change_table(before, metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Copy the committed benchmark and results tables into the README and the pages of
``docs/``, so none of their figures is typed.

    python benchmarks/readme.py           # rewrite every block from its committed file
    python benchmarks/readme.py --check   # exit 1 if a block differs from its file

A block is ``<!-- benchmark:NAME -->`` ... ``<!-- /benchmark:NAME -->`` in a page, with
the body ``benchmarks/results/NAME.md`` exactly, or ``<!-- results:PATH -->`` ...
``<!-- /results:PATH -->`` with the body ``results/PATH.md`` (what the notebooks wrote,
e.g. ``results:cpu/claims_summary``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUTPUTS = ROOT / "results"
BLOCK = re.compile(r"(<!-- (benchmark|results):([\w./-]+) -->\n)(.*?)(<!-- /\2:\3 -->)", re.S)


def blocks(text: str, kind: str = "benchmark") -> dict[str, str]:
    """Block name -> its body for the blocks of `kind`, in the order of the text."""
    return {m.group(3): m.group(4) for m in BLOCK.finditer(text) if m.group(2) == kind}


def synced(text: str, results: Path = RESULTS, outputs: Path = OUTPUTS) -> str:
    """``text`` with every block's body replaced by its committed file."""
    folders = {"benchmark": results, "results": outputs}

    def body(match: re.Match[str]) -> str:
        folder = folders[match.group(2)]
        source = folder / f"{match.group(3)}.md"
        if not source.exists():
            raise SystemExit(f"README block {match.group(3)!r}: no {source.name} in {folder}")
        return match.group(1) + source.read_text() + match.group(5)

    return BLOCK.sub(body, text)


def pages() -> list[Path]:
    """The README and every page of docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks")
    args = parser.parse_args(argv)
    stale, count = [], 0
    for path in pages():
        text = path.read_text()
        new = synced(text)
        count += len(blocks(new)) + len(blocks(new, "results"))
        changed = [
            f"{path.relative_to(ROOT)} {kind}:{name}"
            for kind in ("benchmark", "results")
            for name, body in blocks(text, kind).items()
            if blocks(new, kind)[name] != body
        ]
        stale += changed
        if changed and not args.check:
            path.write_text(new)
    if args.check:
        for name in stale:
            print(f"stale block: {name} (run python benchmarks/readme.py)")
        return 1 if stale else 0
    print(f"{count} blocks, {len(stale)} rewritten: {', '.join(stale) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

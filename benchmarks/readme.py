"""Copy the committed benchmark tables into the README, so none of its figures is typed.

    python benchmarks/readme.py           # rewrite every block from benchmarks/results
    python benchmarks/readme.py --check   # exit 1 if a block differs from its file

A block is ``<!-- benchmark:NAME -->`` ... ``<!-- /benchmark:NAME -->`` in README.md; its
body is ``benchmarks/results/NAME.md`` exactly.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = re.compile(r"(<!-- benchmark:([\w.-]+) -->\n)(.*?)(<!-- /benchmark:\2 -->)", re.S)


def blocks(text: str) -> dict[str, str]:
    """Block name -> its body, in the order of the text."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


def synced(text: str, results: Path = RESULTS) -> str:
    """``text`` with every block's body replaced by its committed file."""

    def body(match: re.Match[str]) -> str:
        source = results / f"{match.group(2)}.md"
        if not source.exists():
            raise SystemExit(f"README block {match.group(2)!r}: no {source.name} in {results}")
        return match.group(1) + source.read_text() + match.group(4)

    return BLOCK.sub(body, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks")
    parser.add_argument("--readme", default=str(ROOT / "README.md"))
    args = parser.parse_args(argv)
    path = Path(args.readme)
    text = path.read_text()
    new = synced(text)
    stale = [name for name, body in blocks(text).items() if blocks(new)[name] != body]
    if args.check:
        for name in stale:
            print(f"stale README block: {name} (run python benchmarks/readme.py)")
        return 1 if stale else 0
    path.write_text(new)
    print(f"{len(blocks(new))} blocks, {len(stale)} rewritten: {', '.join(stale) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

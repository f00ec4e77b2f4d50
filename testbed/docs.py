"""Regenerate the key tables of results/README.md from their one source.

    python -m testbed.docs            # rewrite results/README.md in place
    python -m testbed.docs --check    # exit 1 if it is out of date

The tables come from `testbed.analysis.keys` (record columns, every run's summary keys) and
from each strategy's spec (`summary_keys`); the prose around them is the README's own.
"""

from __future__ import annotations

import sys
from pathlib import Path

from testbed.analysis.keys import fill, sections
from testbed.registry import SPECS

README = Path(__file__).resolve().parent.parent / "results" / "README.md"


def rendered(path: Path = README) -> tuple[str, str]:
    """(current text, text with every generated table brought up to date)."""
    text = path.read_text()
    return text, fill(text, sections(SPECS))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    current, fresh = rendered()
    if "--check" in argv:
        if current != fresh:
            print(f"testbed.docs: {README} is out of date; run python -m testbed.docs", file=sys.stderr)
            return 1
        return 0
    README.write_text(fresh)
    print(README)
    return 0


if __name__ == "__main__":
    sys.exit(main())

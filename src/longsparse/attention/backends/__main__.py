"""``python -m longsparse.attention.backends --table`` prints the backends' capability table;
``--update FILE`` writes it into FILE (docs/architecture.md) between its two marker lines."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from longsparse.attention.backends import capability_table
from longsparse.io import atomic_write_text

BEGIN = "<!-- capability table: begin (python -m longsparse.attention.backends --update docs/architecture.md) -->"
END = "<!-- capability table: end -->"


def with_table(text: str, table: str) -> str:
    """`text` with the lines between its BEGIN and END markers replaced by `table`; ValueError without them."""
    lines = text.split("\n")
    if lines.count(BEGIN) != 1 or lines.count(END) != 1 or lines.index(BEGIN) > lines.index(END):
        raise ValueError(f"needs one line {BEGIN!r} followed by one line {END!r}")
    return "\n".join(lines[: lines.index(BEGIN) + 1] + table.split("\n") + lines[lines.index(END) :])


def table_in(text: str) -> str:
    """The table between the markers of `text`."""
    lines = text.split("\n")
    return "\n".join(lines[lines.index(BEGIN) + 1 : lines.index(END)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m longsparse.attention.backends", description=__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--table", action="store_true", help="print the capability table (markdown)")
    what.add_argument("--update", metavar="FILE", help="write the table into FILE between its marker lines")
    args = parser.parse_args(argv)
    if args.table:
        print(capability_table())
        return 0
    path = Path(args.update)
    try:
        text = path.read_text(encoding="utf-8")
        updated = with_table(text, capability_table())
    except (OSError, ValueError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    if updated != text:
        atomic_write_text(path, updated)
    print(f"{path}: capability table {'updated' if updated != text else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

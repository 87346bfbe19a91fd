"""A generated block of a markdown file: the text between a BEGIN and an END marker that a
module renders, writes (`--markdown [PATH]`) and checks (`--check`: exit 1 when out of date).
bench/records/columns.py (results/README.md's column tables) and contract/reasons.py
(docs/RESULTS.md's reason codes) each declare one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Block:
    """Where a block goes (the file, its markers), who writes it and what it holds."""

    prog: str
    path: Path
    begin: str
    end: str
    render: Callable[[], str]

    def into(self, text: str) -> str:
        """text with render() between its BEGIN and END markers."""
        start, end = text.index(self.begin) + len(self.begin), text.index(self.end)
        return text[:start] + "\n" + self.render() + "\n" + text[end:]

    def main(self, argv: list[str] | None, description: str | None) -> int:
        """`--markdown [PATH]` writes the block into PATH (default self.path); `--check`
        exits 1 when PATH is out of date; neither prints the block."""
        parser = argparse.ArgumentParser(prog=self.prog, description=description)
        parser.add_argument("--markdown", action="store_true", help="write the block")
        parser.add_argument("--check", action="store_true", help="exit 1 if PATH is out of date")
        parser.add_argument("path", nargs="?", type=Path, default=self.path)
        args = parser.parse_args(argv)
        text = args.path.read_text()
        new = self.into(text)
        if args.check:
            if new != text:
                print(f"{args.path} is out of date: {self.prog} --markdown", file=sys.stderr)
                return 1
            return 0
        if args.markdown:
            if new != text:
                args.path.write_text(new)
            print(f"{args.path}: {'updated' if new != text else 'up to date'}")
            return 0
        print(self.render())
        return 0

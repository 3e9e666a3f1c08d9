"""python -m experiments.readme_numbers: --check, --write, --show, --list."""

from __future__ import annotations

import argparse
import pathlib

from experiments.docs_numbers.blocks import BLOCKS, check, regenerate, write
from experiments.docs_numbers.machinery import doc_files, find_blocks
from experiments.docs_numbers.sources import ROOT


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--check",
        action="store_true",
        help="compare the blocks of README.md and docs/*.md with regenerated ones",
    )
    g.add_argument("--write", action="store_true", help="rewrite the blocks of README.md and docs/*.md")
    g.add_argument("--show", metavar="NAME", help="print one regenerated block")
    g.add_argument("--list", action="store_true", help="list the blocks")
    p.add_argument("--only", metavar="LIST", help="comma-separated block names")
    p.add_argument(
        "--readme", default=None, help="one page to check or write (default: README.md and docs/*.md)"
    )
    args = p.parse_args(argv)
    if args.list:
        for name, b in BLOCKS.items():
            print(f"{name:15s} {'fast' if b.fast else 'slow'}  {b.what}")
        return 0
    if args.show:
        if args.show not in BLOCKS:
            raise SystemExit(f"unknown block {args.show!r}; choose from {sorted(BLOCKS)}")
        print(BLOCKS[args.show].make(), end="")
        return 0
    names = None if not args.only else args.only.split(",")
    paths = [pathlib.Path(args.readme)] if args.readme else doc_files()
    texts = {path: path.read_text(encoding="utf-8") for path in paths}
    present = {n for text in texts.values() for n in find_blocks(text)}
    fresh = regenerate([n for n in (names or BLOCKS) if n in present])
    missing = sorted(set(names or BLOCKS) - present)
    if args.write:
        for path, text in texts.items():
            mine = {n: t for n, t in fresh.items() if n in find_blocks(text)}
            if mine:
                path.write_text(write(text, mine), encoding="utf-8")
                print(f"rewrote {len(mine)} block(s) of {path.relative_to(ROOT)}: {', '.join(mine)}")
        return 0
    problems = [f"{n}: in no page (README.md, docs/*.md)" for n in missing]
    for path, text in texts.items():
        mine = {n: t for n, t in fresh.items() if n in find_blocks(text)}
        problems += [f"{path.relative_to(ROOT)}: {p}" for p in check(text, mine)]
    for line in problems:
        print(line)
    print(f"{len(problems)} problem(s) in {len(fresh)} block(s) over {len(texts)} page(s)")
    return 1 if problems else 0

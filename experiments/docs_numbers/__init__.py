"""Regenerate the numbers README.md and the docs pages quote, and check or rewrite them.

Every block of numbers in the README or a page of ``docs/`` lives between
two markers (a block may appear on several pages; each copy is checked)::

    <!-- readme-numbers:NAME tol=T -->
    ...generated text...
    <!-- /readme-numbers:NAME -->

and is produced by one renderer (see :data:`BLOCKS`): computed on the spot
(:mod:`.render_core`) or read from the records slow experiments write
(:mod:`.render_records`, :mod:`.render_fedlog`, :mod:`.render_attacks`).
The prose around the numbers lives in ``templates/*.md``; a renderer only
fills in the numbers, and refuses to render a claim the numbers contradict.
Results are seeded and deterministic on one software stack, so the check
compares every number in a block as printed, exactly when ``tol=0`` (the
default) and within ``T`` otherwise.  Machine-dependent spans (run times,
a result folder's time stamp) are masked and kept as they stand when
writing.  Numbers outside the blocks must be inputs, versions or constants
(:mod:`.stated`, each constant checked against the code).

    python -m experiments.readme_numbers --check          # exit 1 when a page disagrees
    python -m experiments.readme_numbers --write          # rewrite every block in place
    python -m experiments.readme_numbers --show NAME      # print one regenerated block
    python -m experiments.readme_numbers --list

Set ``PRIVFED_CACHE`` to keep the digits features between runs.
"""

from __future__ import annotations

from experiments.docs_numbers.blocks import BLOCKS, Block, check, regenerate, write
from experiments.docs_numbers.cli import main
from experiments.docs_numbers.machinery import (
    DOCS,
    README,
    Found,
    compare,
    doc_files,
    find_blocks,
    keep_volatile,
    numbers,
)
from experiments.docs_numbers.sources import ROOT, template
from experiments.docs_numbers.stated import STATED, outside_blocks, stated_checks, unexplained

__all__ = [
    "BLOCKS",
    "DOCS",
    "README",
    "ROOT",
    "STATED",
    "Block",
    "Found",
    "check",
    "compare",
    "doc_files",
    "find_blocks",
    "keep_volatile",
    "main",
    "numbers",
    "outside_blocks",
    "regenerate",
    "stated_checks",
    "template",
    "unexplained",
    "write",
]

"""Results on disk: a run's folder written as one atomic unit, and checked before any work.

* :mod:`~privfed.results.guard` -- where a run's results may go: names, free space and
  writability checked before any work, one run per folder;
* :mod:`~privfed.results.files` -- one file written atomically, and a finished folder checked
  against its manifest;
* :mod:`~privfed.results.writer` -- the one writer every privfed command uses: a staging folder
  published whole, partial results kept when a run is interrupted;
* :mod:`~privfed.results.ledger` -- a node's lifetime ledger file: typed, versioned sections, bound
  to its roster, checked by a digest, written atomically, refused when missing or damaged.
"""

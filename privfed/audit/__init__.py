"""Empirical differential-privacy audit: lower bounds on what a release leaks, from its outputs.

The package splits the auditor into one job per module:

* :mod:`privfed.audit.estimators`: Clopper-Pearson lower bounds on mu and epsilon from scores
  (:func:`audit_scores`, :func:`audit`), the power formula (:func:`draws_for_power`), the canary
  audit of one Gaussian mechanism's blocks (:func:`audit_gaussian_blocks`) and the one-sided
  noise-scale test (:func:`noise_scale_test`);
* :mod:`privfed.audit.neighbours`: worst-case neighbour pairs (:func:`neighbour_battery`,
  :func:`edge_battery`);
* :mod:`privfed.audit.runner`: the black-box auditor of a release path (:func:`audit_release`):
  deterministic differences, fresh noise, the noise scale against the ledger, then a statistical
  lower bound against the report's claim;
* :mod:`privfed.audit.paths`: the public release paths as runs (:func:`fit_release`,
  :func:`tradeoff_release`, :func:`rounds_release`; the Flower app in
  :mod:`privfed.flower.audit`).

A lower bound above the claimed mu (or eps) proves the claim false; one below it proves nothing:
the audit refutes, never certifies.  :func:`privfed.testing.audit` wraps it for a user's own tests.
"""

from privfed.audit.estimators import (
    DEFAULT_THRESHOLDS,
    AuditResult,
    audit,
    audit_gaussian_blocks,
    audit_scores,
    clopper_pearson_upper,
    draws_for_power,
    noise_scale_test,
)
from privfed.audit.neighbours import Neighbours, edge_battery, neighbour_battery
from privfed.audit.paths import fit_release, rounds_release, server_view, tradeoff_release
from privfed.audit.runner import (
    FAILING,
    MIN_META_DRAWS,
    ReleaseAudit,
    audit_release,
    deterministic_differences,
    output_atoms,
    run_once,
)

__all__ = [
    "DEFAULT_THRESHOLDS",
    "FAILING",
    "MIN_META_DRAWS",
    "AuditResult",
    "Neighbours",
    "ReleaseAudit",
    "audit",
    "audit_gaussian_blocks",
    "audit_release",
    "audit_scores",
    "clopper_pearson_upper",
    "deterministic_differences",
    "draws_for_power",
    "edge_battery",
    "fit_release",
    "neighbour_battery",
    "noise_scale_test",
    "output_atoms",
    "rounds_release",
    "run_once",
    "server_view",
    "tradeoff_release",
]

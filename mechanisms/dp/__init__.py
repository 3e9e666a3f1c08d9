"""Differential privacy on clipped statistics: from a budget to noise, and from what ran to a guarantee.

* clipping each record (:mod:`~mechanisms.dp.clipping`) and the L2 sensitivity of one client's
  statistic it gives (:mod:`~mechanisms.dp.sensitivity`);
* calibration of Gaussian noise (:mod:`~mechanisms.dp.calibration`) and the Gaussian mechanism
  itself (:mod:`mechanisms.dp.gaussian`: its calibration, client side, noise and report);
* noise on class counts only (:mod:`~mechanisms.dp.count_noise`);
* what each release did (:mod:`~mechanisms.dp.ledger`) and the accountants that turn those events
  into (epsilon, delta) (:mod:`~mechanisms.dp.accounting`), and the filter that keeps a lifetime budget
  valid when each release is chosen after the earlier ones (:mod:`~mechanisms.dp.filter`);
* where the random numbers come from (:mod:`~mechanisms.dp.backends`: numpy for simulations,
  OpenDP for releases) and removing the known effect of the noise afterwards
  (:mod:`~mechanisms.dp.noise_aware`).

Users import the public names from :mod:`mechanisms` (``from mechanisms import GaussianMechanism``).
"""

"""The Gaussian mechanism on clipped client statistics (record or client level).

:mod:`~mechanisms.dp.gaussian.mechanism` holds :class:`GaussianMechanism` (imported by users as
``from mechanisms import GaussianMechanism``); it delegates to its calibration (the budget to each
block's sigma, :mod:`~mechanisms.dp.gaussian.calibration`), its client side (bounding, sampling,
noise shares, :mod:`~mechanisms.dp.gaussian.clients`), where it adds noise and how it books each
release (:mod:`~mechanisms.dp.gaussian.noise`) and the guarantee computed from its ledger
(:mod:`~mechanisms.dp.gaussian.report`).
"""

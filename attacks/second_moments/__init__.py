"""Attacks on second moments (FedCOF, FedCGS, Fed3R's Gram matrices).

:mod:`~attacks.second_moments.subspace` tests membership in the span of a released second moment;
:mod:`~attacks.second_moments.unmixing` recovers individual post-ReLU features from it.
"""

"""Tracing (membership inference) on released class means.

:mod:`~attacks.tracing.attack` is the attack, its game and its metrics; :mod:`~attacks.tracing.scores`
holds the membership tests' scores (Gaussian reference models, closed-form tests, the learned test).
"""

"""Feature inversion: rebuild a client's images from what it shared and the known backbone.

:mod:`~attacks.inversion.attack` is the attack and its registry of backends; the optimising
backends (:mod:`~attacks.inversion.backends`), scoring (:mod:`~attacks.inversion.scoring`), the
attacker's public image bank (:mod:`~attacks.inversion.bank`), decoders trained on it
(:mod:`~attacks.inversion.decoders`, :mod:`~attacks.inversion.learned`), pixel refinement
(:mod:`~attacks.inversion.refine`), the joint set attacker (:mod:`~attacks.inversion.joint`), and
seeded deterministic torch and progress bars for the steps that train
(:mod:`~attacks.inversion.determinism`, :mod:`~attacks.inversion.progress`).
"""

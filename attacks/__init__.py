"""What an honest-but-curious server recovers from shared statistics.

The threat model is data (:class:`ServerView`: what the server received,
the noise on it, the backbone, the attacker's public data); each attack
reads a view, declares what it ``requires`` and refuses a view without it;
scoring against the private truth (:class:`GroundTruth`) is separate.

>>> import attacks
>>> attacks.available()
['differencing', 'inversion', 'labels', 'singleton', 'subspace', 'tracing', 'unmixing']

For tables (e.g. the trade-off command), :func:`evaluate` runs one attack on
a view and returns a flat dict of metrics, and :func:`strongest_flat` runs
every attack of a suite on the same challenge and names the strongest::

    view, truth = attacks.scenario("fedncm", features, labels, clients, privacy=spec, ...)
    attacks.evaluate("tracing", view, truth, rng=np.random.default_rng(0))
    attacks.strongest_flat("tracing", view, truth, rng=0)  # strongest_attack, its metrics, each attack's
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attacks.base import Attack
from attacks.knowledge import check_truth
from attacks.strongest import strongest, strongest_flat
from attacks.view import GroundTruth, NoiseSpec, PublicData, ServerView
from privfed._registry import Registry
from privfed._validation.seeds import as_generator
from privfed.errors import ConfigError, InputError

__all__ = [
    "Attack",
    "GroundTruth",
    "NoiseSpec",
    "PublicData",
    "ServerView",
    "available",
    "evaluate",
    "evaluate_federation",
    "get",
    "get_class",
    "register",
    "scenario",
    "strongest",
    "strongest_flat",
]

_REGISTRY: Registry[Attack] = Registry("attack")

#: Register an :class:`Attack` subclass under ``cls.name``.
register = _REGISTRY.register
#: Names of every registered attack, sorted.
available = _REGISTRY.available
#: The class registered as a name; ConfigError listing the names otherwise.
get_class = _REGISTRY.get_class
#: An instance of attack ``name`` with ``params``.
get = _REGISTRY.get


def evaluate(
    name: str, view: ServerView, truth: GroundTruth, *, rng: np.random.Generator | int = 0, **params: Any
) -> dict:
    """Run attack ``name`` on ``view``, score it against ``truth``: a flat dict of metrics.

    Raises :class:`privfed.errors.InputError` naming what the view lacks when
    the attack cannot run on it (e.g. ``subspace`` on a method without
    second moments, ``unmixing`` under secure aggregation).
    """
    attack, rng = get(name, **params), as_generator(rng, "rng")
    check_truth(truth)  # None was an AttributeError deep in the scoring
    if not isinstance(view, ServerView):
        raise InputError(
            f"view must be a ServerView (attacks.scenario(...) returns one), got {type(view).__name__}"
        )
    # a truth of another federation (other clients, classes or width) is refused, never scored
    check_truth(truth, view)
    return attack.evaluate(view, truth, rng)


def evaluate_federation(
    name: str,
    method: str,
    features,
    labels,
    clients,
    *,
    rng: np.random.Generator | int = 0,
    attack_params: dict | None = None,
    images=None,
    holdout_features=None,
    holdout_labels=None,
    strongest: bool = False,
    **view_kwargs: Any,
) -> dict:
    """One call for result tables: build the server's view of a federation, attack it, score it.

    Parameters
    ----------
    name : str
        An attack from :func:`available`.
    method, features, labels, clients :
        The federation (clients -1: sample not uploaded).
    rng : Generator or int
        Drives the view's noise and the attack (two independent streams).
    attack_params : dict, optional
        Parameters of the attack (e.g. ``{"test": "inner"}`` for tracing).
    images, holdout_features, holdout_labels :
        The truth the metrics need: images for ``inversion``, non-members
        for ``tracing`` and ``subspace``.
    strongest : bool
        Run the whole suite of ``name`` (``inversion`` or ``tracing``) on one
        challenge and return :func:`strongest_flat`'s row: the strongest
        attack's metrics under the usual keys, ``strongest_attack`` naming
        it, and ``<attack>:<metric>`` for each attack of the suite
        (``attack_params`` then go to every attack that accepts them).
    **view_kwargs
        ``privacy`` (a :class:`NoiseSpec` or a mechanism, copied, so its
        ledger is left untouched), ``secure_agg``, ``backbone``, ``public``,
        ``num_classes`` and method parameters.

    Returns
    -------
    dict
        The attack's metrics (see each attack's ``score``).

    Raises
    ------
    privfed.errors.InputError
        When the view lacks what the attack reads (its message names it).
    """
    if attack_params is not None and not isinstance(attack_params, dict):
        raise ConfigError(f"attack_params must be a dict like {{'test': 'inner'}}, got {attack_params!r}")
    r_view, r_att = as_generator(rng, "rng").spawn(2)  # a seed outside 0..2**64 - 1 is one line
    view, truth = scenario(
        method,
        features,
        labels,
        clients,
        images=images,
        holdout_features=holdout_features,
        holdout_labels=holdout_labels,
        rng=r_view,
        **view_kwargs,
    )
    if strongest:
        return strongest_flat(name, view, truth, r_att, **(attack_params or {}))
    return get(name, **(attack_params or {})).evaluate(view, truth, r_att)


def scenario(
    method: str,
    features,
    labels,
    clients,
    *,
    images=None,
    holdout_features=None,
    holdout_labels=None,
    holdout_images=None,
    **view_kwargs: Any,
) -> tuple[ServerView, GroundTruth]:
    """The server's view of one federation and the truth to score attacks on it.

    ``view_kwargs`` go to :meth:`ServerView.from_federation` (``privacy``,
    ``secure_agg``, ``backbone``, ``public``, ``rng``, method parameters).
    """
    view = ServerView.from_federation(method, features, labels, clients, **view_kwargs)
    truth = GroundTruth(
        features=features,
        labels=labels,
        clients=clients,
        images=images,
        holdout_features=holdout_features,
        holdout_labels=holdout_labels,
        holdout_images=holdout_images,
    )
    return view, truth


def _register_builtin() -> None:
    from attacks.differencing import Differencing
    from attacks.inversion.attack import FeatureInversion
    from attacks.labels import LabelInference
    from attacks.second_moments.subspace import SubspaceMembership
    from attacks.second_moments.unmixing import SecondMomentUnmixing
    from attacks.singleton import SingletonExposure
    from attacks.tracing.attack import Tracing

    for cls in (
        Differencing,
        FeatureInversion,
        LabelInference,
        SingletonExposure,
        SubspaceMembership,
        Tracing,
        SecondMomentUnmixing,
    ):
        register(cls)


_register_builtin()

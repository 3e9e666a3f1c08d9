"""The values of a Flower run's config, typed at the door: run-config keys (dashed, from ``flwr run``), the
config a node receives from the server (:meth:`privfed.flower.config.FlowerConfig.from_wire`) and the
node's own node config (:func:`node_int`).

Each value is checked against its field's type before the configuration is built: an integer is a whole
number (1.7 and true are refused), a number of seconds is a number (true is refused), a JSON object parses
to an object; a wrong value is one line naming the key.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from privfed._validation import overflows_float64
from privfed.errors import ConfigError

__all__ = [
    "FIELD_TYPES",
    "NODE_CONFIG_KEYS",
    "coerce",
    "misspelt_node_key",
    "node_int",
    "synthetic_spec",
    "wire_value",
]

_INTS = (
    "clients",
    "min_clients",
    "max_records",
    "dropout_tolerance",
    "threshold",
    "degree",
    "rounds",
    "frac_bits",
    "num_classes",
    "partition_seed",
    "noise_seed",
)
_FLOATS = ("epsilon", "delta", "clip", "alpha", "timeout", "connect_timeout")
_TEXTS = ("method", "level", "secure", "wire", "dataset", "partition", "output")
_JSON = ("method_params", "rounds_params")
#: Each field of :class:`~privfed.flower.config.FlowerConfig` and the type its value has on the wire.
FIELD_TYPES: dict[str, str] = {
    **dict.fromkeys(_INTS, "int"),
    **dict.fromkeys(_FLOATS, "float"),
    **dict.fromkeys(_TEXTS, "str"),
    **dict.fromkeys(_JSON, "json"),
    "trusted_aggregator": "bool",
}

#: The largest synthetic data set a node builds (values, D x N): 2**31 float64 values, 16 GiB.
SYNTHETIC_MAX_VALUES = 1 << 31


def _json_object(key: str, value: Any) -> dict:
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a JSON object, got {type(value).__name__} {value!r}")
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{key} is not valid JSON ({exc.msg} at character {exc.pos}): {value!r}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f'{key} must be a JSON object like {{"nu": 1.0}}, got {value!r}')
    return obj


def wire_value(name: str, value: Any) -> Any:
    """A value of the config a node receives, of its field's exact type (ConfigError naming the key)."""
    kind = FIELD_TYPES.get(name)
    key = f"the run config's {name}"
    if kind == "json":
        return _json_object(key, value)
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
    }.get(kind, lambda v: True)
    if not ok(value):
        raise ConfigError(
            f"{key}={value!r} must be {'an' if kind == 'int' else 'a'} {kind}, got {type(value).__name__}"
        )
    return value


def coerce(name: str, value: Any, key: str) -> Any:
    """A run-config value (``flwr run --run-config`` or ``[tool.flwr.app.config]``) as its field's type."""
    kind = FIELD_TYPES.get(name)
    try:
        if name == "partition_seed":
            return one_seed(value)
        if kind == "json":
            return _json_object(f"run-config {key}", value)
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            # 1e999 is not infinity (a number TOML already read as inf cannot be told apart)
            if isinstance(value, str) and overflows_float64(value):
                raise ConfigError(
                    f"run-config {key}={value!r} overflows a float64 (the largest is about 1.8e308); write inf if "
                    "you mean infinity"
                )
            return float(value)
        if kind == "bool":
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                return value.lower() in ("true", "1")
            if not isinstance(value, (bool, int)) or value not in (0, 1):
                raise ValueError
            return bool(value)
    except ConfigError:
        raise
    except (TypeError, ValueError, OverflowError):
        want = {"int": "a whole number", "float": "a number", "bool": "true or false"}.get(kind, kind)
        raise ConfigError(f"run-config {key}={value!r} has the wrong type: it must be {want}") from None
    return value


def one_seed(value: Any) -> int:
    """``seeds`` as the commands write it, for one run: a count of 1 (seed 0) or a list of one ("7,")."""
    if isinstance(value, bool):
        raise ValueError
    text = str(value).strip()
    if "," in text:
        items = [t for t in text.split(",") if t.strip()]
        if len(items) != 1:
            raise ConfigError(
                f"run-config seeds={value!r}: a Flower run is one release on one partition, so one seed "
                '(seeds=1 is seed 0, seeds="7," is seed 7); sweep seeds with privfed.tradeoff'
            )
        seed = int(items[0])
        if not 0 <= seed < 2**64:
            raise ValueError
        return seed
    if isinstance(value, float) and not value.is_integer():
        raise ValueError
    if int(float(text)) != 1:
        raise ConfigError(
            f"run-config seeds={value!r}: a Flower run is one release on one partition, so one seed "
            '(seeds=1 is seed 0, seeds="7," is seed 7); sweep seeds with privfed.tradeoff'
        )
    return 0


def synthetic_spec(dataset: str) -> tuple[int, int]:
    """(D, N) of ``synthetic:D:N``: D >= 1 features, N >= 1 samples a node, D x N within
    :data:`SYNTHETIC_MAX_VALUES`; one line naming the spec otherwise."""
    parts = dataset.split(":")
    good = len(parts) == 3 and all(p.strip().isdigit() for p in parts[1:])
    dim, n = (int(parts[1]), int(parts[2])) if good else (0, 0)
    if not good or dim < 1 or n < 1:
        raise ConfigError(
            f"dataset {dataset!r} must read synthetic:D:N with whole numbers D >= 1 (features) and N >= 1 "
            "(samples a node), e.g. synthetic:1280:50"
        )
    if dim * n > SYNTHETIC_MAX_VALUES:
        raise ConfigError(
            f"dataset {dataset!r}: {dim:,} x {n:,} values a node is over the {SYNTHETIC_MAX_VALUES:,} a synthetic "
            "data set may hold (16 GiB); lower D or N"
        )
    return dim, n


def node_int(node_config: dict, key: str, *, minimum: int = 0, default: int | None = None) -> int:
    """An integer node-config value, checked at the door: a whole number (an int, or its decimal text),
    ``>= minimum``; 1.7, true, "abc" or -1 are refused with one line naming the key (the server names the
    node).  ``default`` when the key is absent (None: the key is required)."""
    if key not in node_config:
        if default is not None:
            return default
        raise ConfigError(f"this node's node config has no {key!r}; give it {key}=<integer>")
    v = node_config[key]
    text = v.strip() if isinstance(v, str) else None
    if isinstance(v, bool) or not (
        isinstance(v, (int, np.integer)) or (text is not None and text.lstrip("-").isdigit())
    ):
        raise ConfigError(
            f"this node's node config {key}={v!r} must be a whole number (e.g. {key}=0), "
            f"got {type(v).__name__} {v!r}"
        )
    n = int(v if text is None else text)
    if n < minimum:
        raise ConfigError(f"this node's node config {key}={n} must be >= {minimum}")
    return n


#: Every node-config key the ClientApp reads (docs/flower.md; a SuperNode's ``--node-config``).
NODE_CONFIG_KEYS = (
    "partition-id",
    "num-partitions",
    "features",
    "secagg-identity",
    "secagg-roster",
    "secagg-ledger",
    "key-holder",
    "noise-backend",
    "dp-budget-epsilon",
    "dp-budget-delta",
    "dp-budget-ledger",
    "dp-trust-server",
    "allow-plain-release",
    "allow-seeded-noise",
    "allow-unbudgeted-dp",
    "allow-ephemeral-ledger",
    "fail-at",
)


def misspelt_node_key(node_config: dict) -> ConfigError | None:
    """The refusal of a node-config key that reads as a misspelling of one the ClientApp reads, or None.

    A misspelt key is not read at all: ``dp_budget_epsilon`` left the node without its budget and
    ``secagg_roster`` made a deployed node answer plain queries.  Keys near none of them are left alone (a
    SuperNode's node config is shared by the apps it runs)."""
    import difflib

    for key in node_config:
        if key in NODE_CONFIG_KEYS:
            continue
        spelt = str(key).strip().lower().replace("_", "-").replace(" ", "-")
        near = (
            [spelt]
            if spelt in NODE_CONFIG_KEYS
            else difflib.get_close_matches(spelt, NODE_CONFIG_KEYS, 1, 0.8)
        )
        if near:
            return ConfigError(
                f"this node's node config has {key!r}, which privfed does not read: did you mean {near[0]!r}? "
                "(node-config keys are dashed; a misspelt key would leave its setting out) Fix the SuperNode's "
                "--node-config"
            )
    return None

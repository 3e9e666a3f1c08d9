"""The shared name registry behind privfed.methods and attacks."""

from __future__ import annotations

import pytest

import attacks
from privfed import methods
from privfed._registry import Registry
from privfed.errors import ConfigError


def test_register_get_and_errors():
    reg: Registry = Registry("widget")

    @reg.register
    class Blue:
        name = "blue"

        def __init__(self, size=1):
            self.size = size

    assert reg.available() == ["blue"]
    assert reg.get("blue", size=3).size == 3
    assert reg.register(Blue) is Blue  # re-registering the same class is harmless
    with pytest.raises(ConfigError, match=r"unknown widget 'red'; available: blue"):
        reg.get("red")
    with pytest.raises(ValueError, match="widget name 'blue' is already registered"):
        reg.register(type("Other", (), {"name": "blue"}))
    with pytest.raises(ValueError, match="has no name"):
        reg.register(type("Nameless", (), {}))


def test_methods_and_attacks_use_it():
    assert methods.available() == [
        "fed3r",
        "fed3r-within",
        "fedcgs",
        "fedcof",
        "fedcof-oracle",
        "fedlog",
        "fedncm",
    ]
    assert "tracing" in attacks.available() and "inversion" in attacks.available()
    with pytest.raises(ConfigError, match="unknown method 'x'; available: fed3r, "):
        methods.get("x")
    with pytest.raises(ConfigError, match="unknown attack 'x'; available: differencing, "):
        attacks.get("x")

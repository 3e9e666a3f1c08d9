"""The shared settings of every command, resolved one way: flags over a config file over one default.

:class:`Settings` reads a command's parsed flags and its ``--config`` file (a
TOML file with keys named like the flags, or a previous run's
``results.json``) and resolves each shared setting with the same checks and
the same one-line messages in every command: the method names (any case, with
a "did you mean" for a typo), the budgets, delta, the clip bound, the level,
the data set and its partition, secure aggregation, method parameters, the
seeds and the output switches.  The defaults are
:data:`privfed.commands.options.FEDERATION`: one federation for all three
commands.  Each command builds its own resolved configuration (a frozen
dataclass, written into its results record) from these values.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mechanisms.dp.calibration import MAX_EPSILON
from privfed._files import read_regular_text
from privfed._validation import overflows_float64
from privfed.commands.options import (
    ATTACK_NAMES,
    FEDERATION,
    METHOD_NAMES,
    PARTITION_NAMES,
    SECURE_AGG_KINDS,
)
from privfed.commands.values import (
    as_bool,
    as_float,
    as_int,
    as_str,
    choose,
    parse_float_list,
    parse_seeds,
    parse_str_list,
)
from privfed.errors import ConfigError, InputError
from privfed.results.files import is_sha256_hex

__all__ = ["Settings", "as_list", "load_config_file", "method_names", "parse_value"]


def load_config_file(
    path: str, flag: str = "--config", command: str | None = None, about: dict | None = None
) -> dict[str, Any]:
    """The settings of a TOML file, or the ``config`` of a privfed ``results.json`` (checked against its manifest;
    with ``command``, refused when the record is another command's or of another schema)."""
    if not str(path).strip():
        raise ConfigError(f"{flag} {path!r} does not name a file; pass a TOML file or a privfed results.json")
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{flag} {path!r} does not exist")
    # a FIFO, a device, a socket or a folder is named and refused, never waited on
    text = read_regular_text(p, f"{flag} {path!r}", "pass a TOML file or a privfed results.json")

    def number(literal: str) -> float:
        """A float TOML or JSON reads; one too large for float64 is refused, not read as infinity."""
        if overflows_float64(literal):
            raise ConfigError(
                f"{flag} {path!r}: the number {literal} overflows a float64 (the largest is about 1.8e308); "
                "write inf if you mean infinity"
            )
        return float(literal)

    if p.suffix.lower() == ".json" or text.lstrip().startswith("{"):  # REC.JSON, a .bak copy: JSON by content
        from privfed.results.files import in_saved_run, verify_folder

        try:
            data = json.loads(text, parse_float=number)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(
                f"{flag} {path!r} is not valid JSON ({exc}); pass a TOML file or a privfed results.json"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            raise ConfigError(
                f"{flag} {path!r} is JSON but has no 'config' table (is it a privfed results.json?)"
            )
        from privfed.results.record import SCHEMA

        if "schema" in data and data["schema"] != SCHEMA:
            raise ConfigError(
                f"{flag} {path!r} is a record of schema {data['schema']!r}, not {SCHEMA!r}: it was not written by "
                "this privfed, so its settings may not mean what they say here"
            )
        other = data.get("command")
        if command is not None and other is not None and other != command:
            raise ConfigError(
                f"{flag} {path!r} is a privfed.{other} record, not a privfed.{command} one; replay it with "
                f"python -m privfed.{other} {flag} {path}"
            )
        if in_saved_run(p):  # a saved run: its files must match their hashes
            try:
                verify_folder(p.parent)
            except InputError as exc:
                raise ConfigError(
                    f"{flag} {path!r}: {exc}; to replay settings on purpose (an edited copy), pass a copy of the "
                    "file outside its run folder"
                ) from None
        config = dict(data["config"])
        if about is not None:
            about["record"] = "schema" in data or "command" in data
        if "schema" in data or "command" in data:  # a privfed record: where the recorded run wrote and how it
            # printed are no settings of the experiment a replay repeats (another JSON's are refused, as TOML's)
            config = {k: v for k, v in config.items() if k not in RUN_OPTIONS}
        meta = data.get("dataset", {}).get("meta") if isinstance(data.get("dataset"), dict) else None
        if (
            isinstance(meta, dict)
            and isinstance(meta.get("sha256"), str)
            and str(config.get("dataset", "")).startswith("file:")
        ):  # the bytes the run read: a replay checks its feature file is still the same
            config["dataset_sha256"] = config.get("dataset_sha256") or meta["sha256"]
        return config

    try:
        return tomllib.loads(text, parse_float=number)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{flag} {path!r} is not valid TOML: {exc}") from None


def as_list(value: Any, flag: str) -> str:
    """A comma-separated flag text from a flag's text or a config value (a string, a number or a list)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ConfigError(f"{flag} must not be empty")
        for v in value:
            if isinstance(v, (bool, dict, list, tuple)) or v is None:
                raise ConfigError(f"{flag}: {v!r} is not allowed in the list")
        return ",".join(str(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return as_str(value, flag)


def parse_value(text: str) -> Any:
    """A ``--param`` value: true / false / none, an int, a float, or the text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def method_names(value: Any, flag: str = "--method") -> tuple[str, ...]:
    """Method names from a flag or a config value, in any case; a typo gets a "did you mean"."""
    names = tuple(
        choose(m, METHOD_NAMES, flag, what="method") for m in parse_str_list(as_list(value, flag), flag)
    )
    if len(set(names)) != len(names):
        raise ConfigError(f"{flag} lists a method twice: {value!r}")
    return names


#: Flags a settings file spells otherwise (the key it takes instead).
FILE_SPELLING = {
    "param": "as the table method_params, e.g. [method_params.fedcof] gamma = 0.1",
    "no_plot": "as plot = false",
}
#: Flags of how a command runs (where it writes, what it prints), never settings of the experiment it records.
RUN_OPTIONS = ("out", "overwrite", "quiet", "config")


def _absolute_file(spec: str, folder: str) -> str:
    """A ``file:PATH`` data set with PATH made absolute (a relative one read from ``folder``); ``file:`` alone
    is left as it is, for the loader's own refusal."""
    path = os.path.expanduser(spec[len("file:") :])
    return "file:" + os.path.normpath(os.path.join(folder, path)) if path else spec


class Settings:
    """A command's flags over its ``--config`` file over :data:`~privfed.commands.options.FEDERATION`.

    ``keys`` are the config-file keys the command accepts (flag names with
    underscores, and the field names its saved ``results.json`` uses); an
    unknown key is refused, naming the allowed ones.
    """

    def __init__(self, args: argparse.Namespace, keys: Iterable[str], command: str | None = None) -> None:
        self.args = args
        self.base: dict[str, Any] = {}
        #: Each settings-file key as the file spells it (max-records for max_records).
        self.spelt: dict[str, str] = {}
        about: dict[str, bool] = {}
        if getattr(args, "config", None) is not None:  # '' too: refused as naming no file, never ignored
            raw = load_config_file(args.config, command=command, about=about)
            # keys as the flags are spelt (max-records) or with underscores (max_records), in every command
            both = sorted(k for k in raw if "-" in k and k.replace("-", "_") in raw)
            if both:  # one spelling would win silently
                raise ConfigError(
                    f"the config file sets {both[0]} and {both[0].replace('-', '_')}, two spellings of one "
                    "setting: keep one of them"
                )
            spelt = self.spelt = {k.replace("-", "_"): k for k in raw}  # a refusal names a key as written
            raw = {k.replace("-", "_"): v for k, v in raw.items()}
            unknown = set(raw) - set(keys)
            for key in sorted(unknown):  # flags a file writes another way, or that belong on the command line
                if key in FILE_SPELLING:
                    raise ConfigError(f"--config: a settings file writes {spelt[key]!r} {FILE_SPELLING[key]}")
                if key in RUN_OPTIONS:
                    raise ConfigError(
                        f"--config: {spelt[key]!r} is a run option, not a setting of the experiment: pass "
                        f"--{key.replace('_', '-')} on the command line"
                    )
            if unknown:
                raise ConfigError(
                    f"--config: unknown setting(s) {sorted(spelt[k] for k in unknown)}; allowed: {sorted(keys)}"
                )
            self.base = dict(raw)
        #: The --config file is a privfed run record (a replay), not settings a user wrote.
        self.replay = bool(about.get("record"))
        #: Where the values of :attr:`base` were written, as a refusal names them.
        self.where = "in the --config file"

    @classmethod
    def of_values(cls, values: dict[str, Any], keys: Iterable[str], where: str) -> Settings:
        """Settings a program wrote (``values``, keys as a settings file's), checked as a settings file's are;
        a refusal names each value's key ``where`` they were written."""
        s = cls(argparse.Namespace(), keys)
        unknown = set(values) - set(keys)
        if unknown:
            raise ConfigError(f"unknown setting(s) {sorted(unknown)}; allowed: {sorted(keys)}")
        s.base, s.where = dict(values), where
        return s

    def raw(self, dest: str, *keys: str) -> Any:
        """The flag's value when given, else the config file's first of ``keys`` (default: ``dest``), else None."""
        both = [k for k in dict.fromkeys(keys) if k in self.base]
        if len(both) > 1:  # one would win silently (the flag given twice is refused too)
            raise ConfigError(
                f"the config file sets {' and '.join(both)}, two spellings of one setting: keep one of them"
            )
        v = getattr(self.args, dest, None)
        if v is not None:
            return v
        for k in keys or (dest,):
            if k in self.base:
                return self.base[k]
        return None

    # -- what runs ----------------------------------------------------------
    def methods(self) -> tuple[str, ...]:
        v = self.raw("method", "method", "methods")
        return method_names(FEDERATION["method"] if v is None else v)

    def method(self) -> str:
        names = self.methods()
        if len(names) != 1:
            raise ConfigError(f"--method takes one method here, got {','.join(names)}")
        return names[0]

    def attacks(self, dest: str = "attack", *keys: str) -> tuple[str, ...]:
        v = self.raw(dest, *(keys or ("attack", "attacks")))
        if v is None or v == []:
            return ()
        names = tuple(
            choose(a, ATTACK_NAMES, "--attack", what="attack")
            for a in parse_str_list(as_list(v, "--attack"), "--attack")
        )
        if len(set(names)) != len(names):  # as --method and --seeds: a repeat would run (and print) twice
            raise ConfigError(f"--attack lists an attack twice: {v!r}")
        return names

    def params(self, methods: Sequence[str]) -> dict[str, dict[str, Any]]:
        """``--param METHOD.KEY=VALUE`` (repeatable) over the file's ``method_params`` table, checked now."""
        from privfed import methods as _methods

        mp = self.base.get("method_params") or {}
        if not isinstance(mp, dict) or not all(isinstance(v, dict) for v in mp.values()):
            raise ConfigError(
                f"method_params must be a table of tables like {{fedcof = {{gamma = 0.1}}}}, got {mp!r}"
            )
        params: dict[str, dict[str, Any]] = {method_names(k)[0]: dict(v) for k, v in mp.items()}
        given: dict[tuple[str, str], str] = {}
        for item in getattr(self.args, "param", None) or []:
            lhs, sep, value = item.partition("=")
            mname, dot, key = lhs.rpartition(".")
            if not sep or not dot or not key or not mname:
                example = f"{methods[0]}.KEY=VALUE" if len(methods) == 1 else "METHOD.KEY=VALUE"
                raise ConfigError(f"--param {item!r} must look like {example}, e.g. fedcof.gamma=0.1")
            name = method_names(mname, "--param")[0]
            if (name, key) in given:  # repeatable for other parameters, never to overwrite one silently
                raise ConfigError(
                    f"--param sets {name}.{key} twice ({given[name, key]!r}, then {item!r}); pass it once"
                )
            given[name, key] = item
            params.setdefault(name, {})[key] = parse_value(value)
        for mname, p in params.items():
            if mname not in methods:
                raise ConfigError(
                    f"--param {mname}.{next(iter(p), 'KEY')}=...: method {mname!r} is not in --method "
                    f"({','.join(methods)}), so the parameter would be ignored; add {mname} to --method "
                    "or drop the parameter"
                )
            _methods.get(mname, **p)  # validates names and values now, not mid-run
        return params

    # -- privacy --------------------------------------------------------------
    def epsilons(self) -> tuple[float, ...]:
        v = self.raw("eps", "eps", "epsilons", "epsilon")
        if v is None:
            return (float(FEDERATION["eps"]),)
        text = as_list(v, "--eps")
        for item in text.split(","):
            try:
                big = float(item) > MAX_EPSILON and math.isfinite(float(item))
            except ValueError:
                big = False  # parse_float_list names it
            if big:  # refused with the flags, not after the budgets listed before it have run
                raise ConfigError(
                    f"--eps {item.strip()} is beyond {MAX_EPSILON:g}: its accounting leaves float64's range (such "
                    "a budget protects nothing); write inf for no noise"
                )
            low = item.strip().lower()
            if low in ("nan", "-inf", "-infinity", "+nan", "-nan"):
                raise ConfigError(
                    f"--eps must be a number > 0 (inf: no protection), got {item.strip()!r}; a NaN or negative "
                    "budget would run without noise"
                )
        eps = tuple(parse_float_list(text, "--eps", positive=True))
        if len(set(eps)) != len(eps):  # as --method and --seeds: a repeat would run twice and fake a spread
            raise ConfigError(f"--eps lists a budget twice: {text!r}")
        return eps

    def epsilon(self) -> float:
        eps = self.epsilons()
        if len(eps) != 1:
            raise ConfigError(
                f"--eps takes one budget here (a Flower run is one release), got {','.join(f'{e:g}' for e in eps)}; "
                "sweep budgets with python -m privfed.tradeoff --eps LIST"
            )
        return eps[0]

    def delta(self) -> float:
        v = self.raw("delta")
        if v is not None and isinstance(v, str) and v.strip().lower() in ("nan", "+nan", "-nan"):
            raise ConfigError(f"--delta must be a finite number in (0, 1), got {v!r}")
        delta = float(FEDERATION["delta"]) if v is None else as_float(v, "--delta")
        if not 0 < delta < 1:  # named as typed: 1e-400 reads as 0.0, which is not what was written
            typed = v if isinstance(v, str) else f"{delta:g}"
            raise ConfigError(
                f"--delta must be in (0, 1), got {typed}"
                + (" (below the smallest float64)" if _underflows(v) else "")
            )
        return delta

    def clip(self) -> float | None:
        v = self.raw("clip")
        if v is None:
            return None
        clip = as_float(v, "--clip")
        if not (clip > 0 and math.isfinite(clip)):
            raise ConfigError(f"--clip must be a finite number > 0, got {clip:g}")
        return clip

    def level(self) -> str:
        v = self.raw("level")
        return FEDERATION["level"] if v is None else choose(v, ("record", "client"), "--level", what="level")

    def secure_agg(self, kinds: Sequence[str] = SECURE_AGG_KINDS) -> str:
        v = self.raw("secure_agg", "secure_agg", "secure")
        if v is None:
            return FEDERATION["secure_agg"]
        v = as_str(v, "--secure-agg").lower()  # as --method and --count-noise read MASK
        if v not in kinds:
            raise ConfigError(f"--secure-agg must be {', '.join(kinds[:-1])} or {kinds[-1]}, got {v!r}")
        return v

    # -- data -----------------------------------------------------------------
    def count_noise(self, kinds: Sequence[str]) -> str | None:
        """``--count-noise`` (None: none; ``none``, the default ``--help`` shows, is none too)."""
        v = self.raw("count_noise")
        if v is None or (isinstance(v, str) and v.strip().lower() == "none"):
            return None
        return choose(v, tuple(kinds), "--count-noise", what="count noise")

    def dataset(self) -> str:
        """The data set; a feature file's path made absolute, so that the run's record replays from any folder
        (a relative path in a settings file a user wrote is read from that file's folder)."""
        v = self.raw("dataset")
        v = FEDERATION["dataset"] if v is None else as_str(v, "--dataset")
        if not v.startswith("file:"):
            return v
        config = getattr(self.args, "config", None)
        from_file = getattr(self.args, "dataset", None) is None and not self.replay and config
        folder = os.path.dirname(os.path.abspath(config)) if from_file else os.getcwd()
        return _absolute_file(v, folder)

    def dataset_sha256(self) -> str | None:
        """The SHA-256 a replayed record's feature file had (None when --dataset names another data set)."""
        named, recorded = getattr(self.args, "dataset", None), self.base.get("dataset")
        if all(isinstance(x, str) and x.startswith("file:") for x in (named, recorded)):
            # the record's path is absolute: 'file:feat.npz' typed in its folder names the same file
            named, recorded = (_absolute_file(x, os.getcwd()) for x in (named, recorded))
        v = self.base.get("dataset_sha256") if named is None or named == recorded else None
        if v is not None and not is_sha256_hex(v):
            raise ConfigError(f"--config: dataset_sha256 must be 64 lowercase hex digits, got {v!r}")
        return v

    def clients(self) -> int:
        v = self.raw("clients")
        return FEDERATION["clients"] if v is None else as_int(v, "--clients", minimum=1)

    def partition(self, extra: Sequence[str] = ()) -> str:
        v = self.raw("partition")
        if v is None:
            return FEDERATION["partition"]
        return choose(v, (*PARTITION_NAMES, *extra), "--partition", what="partition scheme")

    def check_count_noise(self, count_noise: str | None, epsilons) -> None:
        """Uniform count noise (no DP: width (1 - eps) n) takes budgets in (0, 1] only: refused with the flags,
        not once the budgets listed before have run.  A --delta or --calibration flag given with count noise
        that has no use for it (Laplace, geometric: pure DP; uniform: no DP; every count noise: its own law) is
        refused, never ignored (a replayed record's values are not: every record carries both)."""
        if count_noise is not None:
            if self.given("delta") and count_noise != "gaussian":
                raise ConfigError(
                    f"{self.named('delta')} does nothing with --count-noise {count_noise} ("
                    + ("no DP guarantee" if count_noise == "uniform" else "pure DP: delta 0")
                    + "); drop it"
                )
            if self.given("calibration"):
                raise ConfigError(
                    f"{self.named('calibration')} does nothing with --count-noise {count_noise} (calibrated by its "
                    "own law); drop it"
                )
        over = [e for e in epsilons if math.isfinite(e) and not e <= 1.0]  # inf: the no-noise reference row
        if count_noise == "uniform" and over:
            raise ConfigError(
                f"--count-noise uniform needs every --eps in (0, 1] (its width is (1 - eps) n), got "
                f"{', '.join(f'{e:g}' for e in over)}; drop those budgets or pick laplace or geometric count noise"
            )

    def given(self, dest: str) -> bool:
        """Whether the user set ``dest``: as a flag, or in a settings file they wrote (a replayed record carries
        every setting, so its values are not refused as unused)."""
        return getattr(self.args, dest, None) is not None or (not self.replay and dest in self.base)

    def named(self, dest: str, *keys: str) -> str:
        """How a refusal names ``dest`` where the user set it: its flag, or its key in the settings file as the file
        spells it (the first of ``keys`` it sets, default ``dest``)."""
        flag = "--" + dest.replace("_", "-")
        if getattr(self.args, dest, None) is not None:
            return flag
        key = next((k for k in keys if k in self.base), dest)
        return f"{self.spelt.get(key, key)} ({self.where})"

    def replayed(self, dest: str) -> bool:
        """Whether ``dest``'s value comes from a replayed record, not from a flag or a settings file a user wrote:
        a DP record replayed under ``--eps inf`` leaves such settings of its release out (a user's are refused)."""
        return self.replay and getattr(self.args, dest, None) is None and dest in self.base

    def refuse_unused_alpha(self, partition: str) -> None:
        """--alpha given (a flag or a user's settings file) where the split draws no Dirichlet proportions is
        refused, never ignored (a replayed record's alpha is not: every record carries one)."""
        if self.given("alpha") and partition not in (
            "dirichlet",
            "dirichlet-class",
        ):
            raise ConfigError(
                f"{self.named('alpha')} applies to --partition dirichlet or dirichlet-class; drop it (--partition "
                f"{partition} splits by its own rule)"
            )

    def alpha(self) -> float:
        v = self.raw("alpha")
        alpha = float(FEDERATION["alpha"]) if v is None else as_float(v, "--alpha")
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ConfigError(f"--alpha must be a finite number > 0, got {alpha:g}")
        return alpha

    def seeds(self) -> tuple[int, ...]:
        v = self.raw("seeds")
        return parse_seeds(FEDERATION["seeds"] if v is None else v, "--seeds")

    # -- output ---------------------------------------------------------------
    def switch(self, dest: str, key: str | None = None, default: bool = False) -> bool:
        v = self.raw(dest, key or dest)
        return default if v is None else as_bool(v, f"--{dest.replace('_', '-')}")

    def plot(self) -> bool:
        if getattr(self.args, "no_plot", None):
            return False
        v = self.base.get("plot")
        return True if v is None else as_bool(v, "plot")


def _underflows(text) -> bool:
    """Whether a number's text is not zero but reads as 0.0 in float64 (1e-400)."""
    from decimal import Decimal, InvalidOperation

    try:
        return isinstance(text, str) and float(text) == 0.0 and Decimal(text.strip()) != 0
    except (InvalidOperation, ValueError):
        return False

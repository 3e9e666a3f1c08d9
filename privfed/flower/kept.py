"""What a Flower node keeps in its process between messages: parsed identities and rosters, and its masking
state machine.

A node answers the five masking requests of a session one message at a time, and the message that brings
each one may reach another process (a deployment runs a ClientApp process per message; Flower's simulation
hands each message to one of its workers).  What it must know between messages therefore lives in its
``context.state`` (:func:`privfed.flower.secagg.node_step` writes it after every message).  Within one
process it need not be rebuilt from there each time:

* :func:`parsed` parses a roster or identity (a file path or inline JSON, from the node config) once per
  distinct text: a roster of K nodes costs O(K) to parse, and with its graph and fingerprint a few
  milliseconds at K = 1,000, for every message otherwise.
* :class:`KeptNodes` keeps each node's :class:`~mechanisms.secagg.masking.node.MaskingNode` between its
  messages, with the private keys it parsed.  A kept node is used only when the state record in
  ``context.state`` is the one written when it was kept (a token names each write: this process's random
  prefix, drawn again in a forked child, and a counter; unique without a call to the OS per message): a record
  written elsewhere, restored, lost or left by an older session means the node is rebuilt from the record
  (or, with none, starts from nothing and refuses out-of-order requests, as before).  A node that finished
  or aborted is dropped, with its secrets.
* :class:`KeptClientApp` is the ClientApp itself, built once per process: Flower's simulation pickles the
  ClientApp with every message it hands a Ray worker, and cloudpickle copies a ClientApp's handlers (closures)
  by value, code and all, every time.  This one pickles as the call that builds it.
"""

from __future__ import annotations

import copyreg
import hashlib
import itertools
import json
import os
import pathlib
import pickle

from flwr.clientapp import ClientApp

from mechanisms.secagg.identity import Identity, Roster
from mechanisms.secagg.masking.node import MaskingNode
from privfed._files import read_regular_text

__all__ = ["KeptClientApp", "KeptNodes", "TOKEN", "built_app", "parsed"]

#: The key of the state record holding the token of the write that kept the node.
TOKEN = "kept"
_WRITES = itertools.count()
_PREFIX = ""


def _fresh_prefix() -> None:
    """Draw this process's token prefix (again in a forked child, whose writes must not repeat its parent's)."""
    global _PREFIX
    _PREFIX = os.urandom(8).hex()


_fresh_prefix()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_prefix)

#: At most this many parsed rosters and identities, and as many built ClientApps, are kept (least recently
#: added dropped first).
PARSED_LIMIT = 64

_PARSED: dict[tuple[str, str], object] = {}


def parsed(value: str, kind: type):
    """The :class:`Roster` or :class:`Identity` that ``value`` names (inline JSON or a file path), parsed once
    per distinct text (a file is read on every call: its content is the key)."""
    text = str(value)
    inline = text.lstrip().startswith("{")
    if not inline:
        path = pathlib.Path(text).expanduser()
        if not path.is_file():
            return kind.load(text)  # its one-line error (a FIFO, a device or a socket is named, never read)
        what = "secagg-roster" if kind is Roster else "secagg-identity"
        text = read_regular_text(path, f"{what}={value}", "pass the file the operator wrote")
    key = (kind.__name__, text)
    got = _PARSED.get(key)
    if got is None:
        if kind is Roster:
            got = Roster.from_json(text, "secagg-roster" if inline else f"secagg-roster={value}")
        else:
            try:
                raw = json.loads(text)
                got = Identity(raw["index"], bytes.fromhex(raw["private_key"]))
            except (KeyError, TypeError, ValueError) as exc:
                from privfed.errors import ConfigError

                why = f"no {exc} field" if isinstance(exc, KeyError) else str(exc)
                where = "secagg-identity (inline JSON)" if inline else f"secagg-identity={value}"
                raise ConfigError(
                    f"{where} is not a privfed identity ({why}): pass the node-<i>.json file the operator wrote "
                    "with python -m mechanisms.secagg.identity"
                ) from None
        _keep(_PARSED, key, got)
    return got


class KeptNodes:
    """Masking state machines kept between messages in this process (see the module docstring)."""

    def __init__(self) -> None:
        self._nodes: dict[tuple, tuple[str, MaskingNode]] = {}

    def node(self, key: tuple, record, fresh: bool, make) -> MaskingNode:
        """The node for ``key`` (run, node, roster, identity): a fresh one for a session's first request
        (``fresh``), the kept one if ``record`` (the state record in ``context.state``, or None) carries the
        token it was kept with, else ``make(state)`` rebuilt from the record (None: nothing to rebuild)."""
        if fresh:
            self._nodes.pop(key, None)
            return make(None)
        kept = self._nodes.get(key)
        if kept is not None and record is not None and record.get(TOKEN) == kept[0]:
            return kept[1]
        self._nodes.pop(key, None)
        if record is None:
            return make({"stage": "new"})
        return make({k: v for k, v in dict(record).items() if k != TOKEN})

    def keep(self, key: tuple, node: MaskingNode, state, record_type):
        """Keep ``node`` (or drop it once it finished or aborted) and return its state record, with the token
        of this write: ``state`` (the record in ``context.state``, or None) updated in place where it is the
        record this node was kept with (only the values that changed are written), else a new
        ``record_type`` of the node's state."""
        values = node.state()
        kept = self._nodes.pop(key, None)
        if values.get("stage") in ("done", "aborted"):
            return record_type(values)
        token = f"{_PREFIX}.{next(_WRITES)}"
        self._nodes[key] = (token, node)
        values[TOKEN] = token
        if kept is None or kept[1] is not node or state is None or state.get(TOKEN) != kept[0]:
            return record_type(values)
        for k in [k for k in state.keys() if k not in values]:
            del state[k]
        for k, v in values.items():
            if k not in state or state[k] is not v:
                state[k] = v
        return state

    def __len__(self) -> int:
        return len(self._nodes)


class KeptClientApp(ClientApp):
    """A ClientApp that pickles as the call that builds it: ``build(*args)`` (``build`` a module-level function,
    pickled by reference) and a token; a process that unpickles it builds it once per token (:func:`built_app`)
    and keeps it.  Flower's simulation pickles the ClientApp with every message it hands a worker; pickled by
    value, the handlers' code and closures would be copied each time.

    The builder seals the app when it is done (:meth:`seal`).  An app changed after that (a handler, mod or
    lifespan added) is no longer what ``build(*args)`` makes, so it pickles by value, as any ClientApp; the
    token covers the arguments as they are when pickled, so arguments changed later are built anew."""

    def __init__(self, build, args: tuple) -> None:
        super().__init__()
        self._built_by = (build, tuple(args), os.urandom(8).hex())
        self._sealed: dict | None = None

    def _shape(self) -> dict:
        """Everything the app holds but its builder's record (containers copied, so a later change shows)."""
        return {
            k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
            for k, v in self.__dict__.items()
            if k not in ("_built_by", "_sealed")
        }

    def seal(self) -> KeptClientApp:
        """Mark the app as built: from now on it pickles as its builder's call while it stays as it is."""
        self._sealed = self._shape()
        return self

    def __reduce__(self):
        if self._sealed is None or self._shape() != self._sealed:
            return (copyreg.__newobj__, (type(self),), dict(self.__dict__))
        build, args, nonce = self._built_by
        digest = hashlib.sha256(pickle.dumps(args)).hexdigest()[:16]
        return (built_app, (build, args, f"{nonce}.{digest}"))


#: The ClientApps this process built from a pickled :class:`KeptClientApp`, by its token.
_BUILT: dict[str, ClientApp] = {}


def built_app(build, args: tuple, token: str) -> ClientApp:
    """The ClientApp ``build(*args)`` this process built for ``token`` (built on the first call)."""
    app = _BUILT.get(token)
    if app is None:
        app = _keep(_BUILT, token, build(*args))
    return app


def _keep(cache: dict, key, value):
    """``cache[key] = value``, the oldest entries dropped first so that it holds at most :data:`PARSED_LIMIT`."""
    while len(cache) >= PARSED_LIMIT:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value

"""What the deployment tests share: the operator's material, Flower's processes, and their clean-up.

:func:`operator_material` runs the documented operator and node commands (in this process, through
their ``main``): the CA and SuperLink certificate, the roster and identities, each node's Flower key
and binding, the verified list.  :class:`Processes` starts Flower's executables -- each in its own
process group, optionally inside a network namespace (``ip netns exec``) -- and stops every one of
them and everything they spawned, also when a test fails.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from mechanisms.secagg import identity as identity_cli
from privfed.flower.deploy import auth, certs
from privfed.flower.simulation import descendants

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
APP = REPO / "privfed" / "flower" / "app"
#: the connection name every test FLWR_HOME defines
LINK = "privfed"


@dataclass
class Material:
    root: pathlib.Path
    certs: pathlib.Path
    ids: pathlib.Path
    keys: list[pathlib.Path]  # node i's directory: flower-key, flower-key.pub, flower-key.binding.json
    registered: pathlib.Path  # node-<i>.pub and node-keys.json, as the operator's verify step wrote them

    @property
    def ca(self) -> pathlib.Path:
        return self.certs / certs.CA_CERT

    @property
    def node_keys(self) -> pathlib.Path:
        return self.registered / auth.LIST_FILE

    def node_config(self, i: int, extra: str = "") -> str:
        ids = self.ids
        return (
            f"partition-id={i} num-partitions={len(self.keys)}{extra} allow-plain-release=true "
            f'secagg-identity="{ids / f"node-{i}.json"}" secagg-roster="{ids / "roster.json"}" '
            f'secagg-ledger="{self.ledger(i)}"'
        )

    def ledger(self, i: int) -> pathlib.Path:
        """Node ``i``'s ledger file (made by the operator's --init-ledger step)."""
        return self.root / f"ledger-{i}.json"


def operator_material(root: pathlib.Path, superlink_hosts: list[str], nodes: int) -> Material:
    """Everything docs/flower.md has the operator and the nodes make, in ``root``."""
    m = Material(
        root,
        root / "certs",
        root / "ids",
        [root / f"node-{i}-keys" for i in range(nodes)],
        root / "registered",
    )
    hosts = [a for h in superlink_hosts for a in ("--host", h)]
    assert certs.main([str(m.certs), *hosts]) == 0
    # t = 2 of 3, so that a node that dies mid-run is survived: that tolerates no colluder, and the operator
    # says so explicitly (--colluders 0); then each node's ledger file, made once (the documented step).
    roster = ["--nodes", str(nodes), "--threshold", "2", "--colluders", "0"]
    assert identity_cli.main([str(m.ids), *roster]) == 0
    for i in range(nodes):
        init = ["--init-ledger", str(m.ledger(i)), "--roster", str(m.ids / "roster.json")]
        assert identity_cli.main(init) == 0
    for i, d in enumerate(m.keys):
        argv = [
            "node-key",
            str(d),
            "--identity",
            str(m.ids / f"node-{i}.json"),
            "--roster",
            str(m.ids / "roster.json"),
        ]
        assert auth.main(argv) == 0
    bindings = [str(d / auth.BINDING_FILE) for d in m.keys]
    assert (
        auth.main(["verify", *bindings, "--roster", str(m.ids / "roster.json"), "--out", str(m.registered)])
        == 0
    )
    return m


def flwr_home(path: pathlib.Path, address: str, ca: pathlib.Path | None) -> pathlib.Path:
    """A FLWR_HOME whose config names the SuperLink at ``address``, trusting ``ca`` (None: the system's store)."""
    path.mkdir(parents=True, exist_ok=True)
    lines = ["[superlink]", f'default = "{LINK}"', "", f"[superlink.{LINK}]", f'address = "{address}"']
    if ca is not None:
        lines.append(f'root-certificates = "{ca}"')
    (path / "config.toml").write_text("\n".join(lines) + "\n")
    return path


def env_for(home: pathlib.Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PYTHONPATH": str(REPO),
    }


def in_netns(netns: str | None, args: list) -> list[str]:
    return (["ip", "netns", "exec", netns] if netns else []) + [str(a) for a in args]


def superlink_args(m: Material, host: str, port: int) -> list:
    """The documented SuperLink command: TLS with the operator's certificates, node authentication on."""
    return [
        BIN / "flower-superlink",
        "--ssl-ca-certfile",
        m.ca,
        "--ssl-certfile",
        m.certs / certs.SERVER_CERT,
        "--ssl-keyfile",
        m.certs / certs.SERVER_KEY,
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--host",
        host,
        "--port",
        str(port),
    ]


def supernode_args(
    superlink: str, key: pathlib.Path, ca: pathlib.Path | None, port: int, node_config: str = ""
) -> list:
    """The documented SuperNode command (``ca=None``: a node without the operator's CA)."""
    args = [BIN / "flower-supernode", "--superlink", superlink, "--auth-supernode-private-key", key]
    if ca is not None:
        args += ["--root-certificates", ca]
    args += ["--port", str(port)]
    return args + (["--node-config", node_config] if node_config else [])


class Processes:
    """Flower processes started for one test; :meth:`stop` ends them all and everything they spawned."""

    def __init__(self, logs: pathlib.Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list, log: str, env: dict, netns: str | None = None) -> subprocess.Popen:
        p = subprocess.Popen(
            in_netns(netns, args),
            env=env,
            cwd=self.logs,
            stdout=open(self.logs / log, "w"),  # noqa: SIM115 - the child owns it
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def log(self, name: str) -> str:
        return (self.logs / name).read_text(errors="replace")

    def wait_log(self, name: str, pattern: str, timeout: float, proc: subprocess.Popen | None = None) -> str:
        """Wait until the log ``name`` matches ``pattern`` (the process must stay alive unless ``proc`` is None)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log(name)
            if re.search(pattern, text):
                return text
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name}: the process exited ({proc.returncode}) first:\n{text[-3000:]}")
            time.sleep(0.3)
        raise TimeoutError(f"{name}: no {pattern!r} after {timeout} s:\n{self.log(name)[-3000:]}")

    def stop(self) -> None:
        spawned = set().union(*(descendants(p.pid) for p in self.procs)) if self.procs else set()
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        for pid in spawned:  # children Flower detached into groups of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def flwr(
    env: dict, *args, netns: str | None = None, timeout: float = 120, cwd=None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        in_netns(netns, [BIN / "flwr", *args]),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def last_json(text: str) -> dict:
    """The JSON object a ``flwr ... --format json`` command printed (pretty-printed, after any other lines)."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            return json.loads("\n".join(lines[i:]))
    raise AssertionError(f"no JSON in:\n{text[-2000:]}")


def register(env: dict, pub: pathlib.Path, netns: str | None = None) -> int:
    """``flwr supernode register KEY.pub``: the new node's id."""
    res = flwr(env, "supernode", "register", pub, LINK, "--format", "json", netns=netns)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return int(last_json(res.stdout)["node-id"])


def wait_online(env: dict, node_ids: set[int], timeout: float, netns: str | None = None) -> None:
    """Poll ``flwr supernode ls`` until every node of ``node_ids`` is online."""
    deadline = time.monotonic() + timeout
    seen: dict = {}
    while time.monotonic() < deadline:
        res = flwr(env, "supernode", "ls", LINK, "--format", "json", netns=netns)
        if res.returncode == 0:
            seen = {int(n["node-id"]): n["status"] for n in last_json(res.stdout)["nodes"]}
            if all(seen.get(n) == "online" for n in node_ids):
                return
        time.sleep(1)
    raise TimeoutError(f"nodes {sorted(node_ids)} not all online after {timeout} s: {seen}")


def run_app(env: dict, out: pathlib.Path, netns: str | None = None, **config) -> dict:
    """``flwr run`` the app with ``config``; the head and the report the ServerApp wrote."""
    rc = " ".join(f"{k}={json.dumps(v)}" for k, v in {"out": str(out), **config}.items())
    proc = flwr(
        env, "run", APP, LINK, "--stream", "--run-config", rc, netns=netns, timeout=400, cwd=out.parent
    )
    # flwr run exits 0 even when the run failed on the SuperLink: the report is the evidence.
    assert (out / "report.json").exists(), proc.stdout[-4000:] + proc.stderr[-3000:]
    head = np.load(out / "head.npz")
    return {
        "weight": head["weight"],
        "report": json.loads((out / "report.json").read_text()),
        "log": proc.stdout,
    }

"""Deploying the Flower app across machines: TLS certificates, node keys bound to the roster, the deployed ServerApp.

The operator of a deployment makes, once:

* a certificate authority and the SuperLink's TLS certificate
  (:mod:`privfed.flower.deploy.certs`, ``python -m privfed.flower.deploy.certs``): every SuperNode and
  every ``flwr`` command checks the SuperLink against that CA;
* each node's Flower authentication key, bound to its secure-aggregation roster identity
  (:mod:`privfed.flower.deploy.auth`, ``python -m privfed.flower.deploy.auth``): the node signs its
  Flower public key with its roster identity, the operator verifies the signature before registering
  the key with the SuperLink (``flwr supernode register``), and writes the verified list that the
  deployed ServerApp reads;
* the deployed ServerApp (:mod:`privfed.flower.deploy.server`, named by ``privfed/flower/app``) sends
  messages only to nodes whose Flower key (the one the SuperLink authenticated) is in that list.

docs/flower.md walks through the commands and states what each part protects against.
"""

from __future__ import annotations

__all__: list[str] = []

"""The baselines of a multi-round FedLog run: FedAvg of the whole model, and local-only training."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from privfed.rounds.bodies import FEATURE_DIM, num_parameters
from privfed.rounds.training import accuracy, init_body

if TYPE_CHECKING:
    from privfed.rounds.config import RoundsConfig
    from privfed.rounds.training import RoundsSetup

__all__ = ["fedavg_baseline", "local_baseline"]


class _Classifier(nn.Module):
    def __init__(self, body: nn.Module, C: int = 10):
        super().__init__()
        self.body = body
        self.head = nn.Linear(FEATURE_DIM, C)

    def forward(self, x):
        return self.head(self.body(x))


def _train_classifier(model, opt, x, y, epochs, batch_size, gen) -> None:
    F = torch.nn.functional
    model.train()
    n = y.shape[0]
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            b = perm[start : start + batch_size]
            loss = F.cross_entropy(model(x[b]), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()


def _predict(model, x) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return model(x).argmax(dim=1).numpy()


def fedavg_baseline(cfg: RoundsConfig, setup: RoundsSetup, bar=None) -> dict:
    """FedAvg of the whole model (body + linear head), every client the same family."""
    K = cfg.clients
    fam = cfg.fedavg_family
    torch.manual_seed(int(np.random.default_rng([cfg.seed, 0xFEDA]).integers(2**62)))
    glob = _Classifier(init_body(fam, cfg.init, cfg.seed, 0))
    data = [setup.client_data(k) for k in range(K)]
    gens = [
        torch.Generator().manual_seed(int(np.random.default_rng([cfg.seed, 0xB0D7, k]).integers(2**62)))
        for k in range(K)
    ]
    n = np.array([d[1].shape[0] for d in data], dtype=np.float64)
    w = n / n.sum()
    history = []
    for r in range(cfg.rounds):
        states = []
        for k in range(K):
            local = copy.deepcopy(glob)
            opt = torch.optim.Adam(local.parameters(), lr=cfg.lr)
            _train_classifier(local, opt, data[k][0], data[k][1], cfg.local_epochs, cfg.batch_size, gens[k])
            states.append(local.state_dict())
        avg = {key: sum(float(w[k]) * states[k][key] for k in range(K)) for key in states[0]}
        glob.load_state_dict(avg)
        pers = float(np.mean([accuracy(_predict(glob, d[2]), d[3]) for d in data if d[3].size]))
        common = accuracy(_predict(glob, setup.xt_all), setup.yt_all)
        history.append({"round": r + 1, "personalised": pers, "common": common})
        if bar is not None:
            bar.set_postfix_str(f"fedavg r{r + 1} pers {pers:.3f}")
            bar.update(1)
    P = num_parameters(glob)
    return {
        "history": history,
        "personalised": history[-1]["personalised"],
        "common": history[-1]["common"],
        "family": fam,
        "parameters": P,
        "upload_bytes_per_round": 4 * P * K,
        "upload_bytes_total": 4 * P * K * cfg.rounds,
        "download_bytes_per_round": 4 * P * K,
    }


def local_baseline(cfg: RoundsConfig, setup: RoundsSetup, families, bar=None) -> dict:
    """Each client trains body + its own linear head for R x E epochs; nothing is shared."""
    pers, common = [], []
    for k in range(cfg.clients):
        x, y, xt, yt = setup.client_data(k)
        torch.manual_seed(int(np.random.default_rng([cfg.seed, 0x10CA, k]).integers(2**62)))
        model = _Classifier(init_body(families[k], cfg.init, cfg.seed, k))
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        gen = torch.Generator().manual_seed(int(np.random.default_rng([cfg.seed, 0xB0D7, k]).integers(2**62)))
        _train_classifier(model, opt, x, y, cfg.rounds * cfg.local_epochs, cfg.batch_size, gen)
        if yt.size:
            pers.append(accuracy(_predict(model, xt), yt))
        common.append(accuracy(_predict(model, setup.xt_all), setup.yt_all))
        if bar is not None:
            bar.update(1)
    return {
        "personalised": float(np.mean(pers)),
        "common": float(np.mean(common)),
        "upload_bytes_per_round": 0,
        "upload_bytes_total": 0,
    }

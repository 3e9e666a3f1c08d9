"""Multi-round FedLog's releases observed for the membership attacks of :mod:`attacks.rounds`.

:class:`RoundsObserver` is the harness :func:`privfed.rounds.run_rounds` calls after every release
(``attack_pairs`` > 0): it picks member and holdout records, reads what the server saw from each
round's trace and collects the rows the attacks score (:class:`attacks.rounds.RoundsAttackData`).
The attacks' mathematics stays in :mod:`attacks.rounds`; what needs the rounds' bodies lives here.
"""

from __future__ import annotations

import math

import numpy as np

from attacks.rounds import RoundsAttackData, evaluate_rounds_attacks, mean_cov
from privfed.errors import ConfigError
from privfed.rounds.bodies import augment, client_features
from privfed.rounds.release import augmented, released_statistic

__all__ = ["RoundsObserver"]


class RoundsObserver:
    """Collects each round's attack data inside :func:`privfed.rounds.run_rounds` (``attack_pairs`` > 0).

    Called by the protocol after every release with ``(round, clients, A, trace)``: the clients' private
    state (bodies), the per-client statistics A (K, C, m) and the round's
    :class:`~privfed.release.ReleaseTrace`.  What the server saw (every upload, or only a sum) and the
    noise on it are read from the trace (:meth:`~privfed.release.ReleaseTrace.server_view`, its events),
    never rebuilt.
    """

    def __init__(self, setup, cfg, dp, release) -> None:
        import torch

        self.setup, self.cfg, self.dp, self.release = setup, cfg, dp, release
        self.view: str | None = None  # "uploads" or "sum": read from the first round's trace
        rng = np.random.default_rng([cfg.seed, 0xA77A])
        y = setup.y_all.numpy()
        yt = np.asarray(setup.yt_all)
        C = setup.C
        uploaded = np.flatnonzero(np.asarray(setup.clients) >= 0)  # a partition may leave records unassigned
        want = rng.choice(uploaded, size=min(int(cfg.attack_pairs), uploaded.size), replace=False)
        members, holdouts = [], []
        for c in range(C):
            mc = want[y[want] == c]
            pool = rng.permutation(np.flatnonzero(yt == c))
            k = min(mc.size, pool.size)
            members.extend(mc[:k].tolist())
            holdouts.extend(pool[:k].tolist())
        if not members:
            raise ConfigError("attack_pairs found no member record with a holdout of its class")
        self.members = np.asarray(members)
        self.holdouts = np.asarray(holdouts)
        self.classes = y[self.members]
        self.owner = np.asarray(setup.clients)[self.members]
        self.x_targets = torch.cat([setup.x_all[self.members], setup.xt_all[self.holdouts]])
        splits = setup.splits
        self.x_public = torch.from_numpy(np.array(splits.public_images, dtype=np.float32))[:, None]
        self.y_public = np.asarray(splits.public_labels)
        self.data = RoundsAttackData(view="", classes=self.classes, clients=self.owner)
        self._prev_public: dict[int, np.ndarray] = {}

    def __call__(self, r, clients, A, trace) -> None:
        from privfed._linalg import one_blas_thread

        # many small d x d decompositions: BLAS threads only spin on them
        with one_blas_thread():
            self._observe(r, clients, A, trace)

    @staticmethod
    def server_saw(trace) -> tuple[str, np.ndarray, float]:
        """From the round's trace: the view attacked, the released rows and the noise sd on each row.

        The server saw every client's upload in clear ("uploads": attacked row by row) or only a sum
        (a trusted aggregator's noisy sum, a secure sum, or the sum of uploads each carrying its own
        noise: attacked on the sum, whose noise is then sqrt(K) times each upload's).
        """
        received, released = trace.server_view(), trace.release_view()
        noise = [e for e in trace.events if e["mechanism"] == "gaussian"]
        sigma = float(noise[-1]["scale"]) if noise else 0.0
        if received.kind == "uploads" and not noise:
            return "uploads", augmented(received.stats), 0.0
        if (
            released.kind == "uploads"
        ):  # no aggregator's noise: every upload carries its own sigma into the sum
            sigma *= math.sqrt(released.stats.num_clients)
        return "sum", released_statistic(trace), sigma

    def _observe(self, r, clients, A, trace) -> None:
        dp = self.dp
        view, seen, sigma = self.server_saw(trace)
        if self.view is None:
            self.view = self.data.view = view
        elif view != self.view:
            raise ConfigError(f"round {r + 1}'s server saw {view!r}, earlier rounds {self.view!r}")
        clip_fn = dp.clip_tensor if dp is not None else None
        P = self.members.size
        K, C, m = A.shape
        # the mechanism's scaling of each client's upload (1 under the theorem bound or without DP)
        factor = dp.upload_factors(A) if dp is not None else np.ones(K)
        Ab = A * factor[:, None, None]
        phi = np.empty((2 * P, m))
        import torch

        # every body's public features (for the models) and the targets through their row's body
        need = (
            {(int(k), int(c)) for k in range(K) for c in range(C) if A[k, c, 0] > 0}
            if self.view == "sum"
            else {(int(k), int(c)) for k, c in zip(self.owner, self.classes)}
        )
        models, inc_models = {}, {}
        for k in sorted({k for k, _ in need}):
            Fp = client_features(clients[k].body, self.x_public, clip_fn)
            prev = self._prev_public.get(k)
            self._prev_public[k] = Fp
            for c in sorted({c for kk, c in need if kk == k}):
                sel = self.y_public == c
                models[(k, c)] = mean_cov(Fp[sel])
                inc_models[(k, c)] = models[(k, c)] if prev is None else mean_cov(Fp[sel] - prev[sel])
        for k in np.unique(self.owner):
            idx = np.flatnonzero(self.owner == k)
            x = torch.cat([self.x_targets[idx], self.x_targets[P + idx]])
            f = augment(torch.from_numpy(client_features(clients[int(k)].body, x, clip_fn))).numpy()
            phi[idx] = f[: idx.size] * factor[k]
            phi[P + idx] = f[idx.size :] * factor[k]
        released = np.empty((P, m))
        clean = np.empty((P, m))
        for p in range(P):
            k, c = int(self.owner[p]), int(self.classes[p])
            released[p] = seen[k, c] if self.view == "uploads" else seen[c]
            clean[p] = A[k, c] if self.view == "uploads" else Ab[:, c].sum(0)
        level = self._row_models(models, A, factor)
        inc = self._row_models(inc_models, A, factor)
        D = self.data
        D.phi.append(phi)
        D.released.append(released)
        D.clean.append(clean)
        D.sigma.append(sigma)
        for name, arr in zip(("one_mean", "one_cov", "rest_mean", "rest_cov"), level):
            getattr(D, name).append(arr)
        for name, arr in zip(("one_mean", "one_cov", "rest_mean", "rest_cov"), inc):
            getattr(D, "inc_" + name).append(arr)

    def _row_models(self, models, A, factor):
        """Per pair: Gaussian model of one more record of the member's client's class, and of the row's rest."""
        P = self.members.size
        K = A.shape[0]
        d = A.shape[2] - 1
        one_mean, one_cov = np.empty((P, d)), np.empty((P, d, d))
        rest_mean, rest_cov = np.empty((P, d)), np.empty((P, d, d))
        row_total: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for p in range(P):
            k, c = int(self.owner[p]), int(self.classes[p])
            om, oc = models[(k, c)]
            one_mean[p], one_cov[p] = om * factor[k], oc * factor[k] ** 2
            key = (k, c) if self.view == "uploads" else (-1, c)
            if key not in row_total:  # every record of the row, modelled
                rm, rc = np.zeros(d), np.zeros((d, d))
                for kk in [k] if self.view == "uploads" else range(K):
                    n = A[kk, c, 0]
                    if n > 0:
                        mm, cc = models[(kk, c)]
                        rm += n * mm * factor[kk]
                        rc += n * cc * factor[kk] ** 2
                row_total[key] = (rm, rc)
            rm, rc = row_total[key]
            rest_mean[p], rest_cov[p] = (
                rm - one_mean[p],
                rc - one_cov[p],
            )  # the row less one record of client k
        return one_mean, one_cov, rest_mean, rest_cov

    def evaluate(self, rng: np.random.Generator) -> dict:
        dp = self.dp
        mu_total = mu_one = None
        if dp is not None:
            rep = dp.report()
            mu_total, mu_one = rep.mu_total, rep.mu_per_release
        from privfed._linalg import one_blas_thread

        with one_blas_thread():
            out = evaluate_rounds_attacks(self.data, rng, mu_total=mu_total, mu_per_release=mu_one)
        if dp is not None:
            out["bound_formal"] = bool(rep.formal)
            if not rep.formal:
                out["bound_note"] = (
                    "the releases carry no formal guarantee (Theorem 3.1's sensitivity with trained "
                    "bodies): Phi(mu_total / sqrt 2) is what the paper's accounting would imply, "
                    "not a bound"
                )
        if dp is not None and dp.placement == "local":
            out["note"] = (
                "local placement: the attacks are run on the noisy sum only (each client's noisy upload, "
                "which the server also sees, is not attacked)"
            )
        return out

"""Feature inversion: rebuild a client's images from what it shared and the known backbone.

A released class mean m_kc = s_kc / n_kc is the backbone feature of a
client's images averaged over n_kc samples; with n_kc = 1 it is the feature
of one image.  Knowing the frozen backbone f, the server looks for an image
x whose feature matches (methods.md section 5, "feature inversion"; the
FedCGS paper, Guan et al., evaluates this attack by PSNR):

    min_x  ||f(x) - m||^2 / ||m||^2 + lambda_TV TV(x),   x in [0, 1]^{H x W}

Backends (``backend=``):

* ``pixel``: Adam on the pixels (x = sigmoid(z)) with a total-variation
  prior (Mahendran & Vedaldi, CVPR 2015), started from the attacker's public
  class-mean image;
* ``decoder``: an MLP trained on the attacker's public (feature, image)
  pairs (Dosovitskiy & Brox, CVPR 2016), applied to the released feature;
  under noise it is trained noise-aware (public features plus the view's
  noise on a mean), so it returns the posterior-mean image;
* ``dip``: a deep-image-prior generator (Ulyanov, Vedaldi & Lempitsky, CVPR
  2018): a small convolutional net from a fixed random input whose weights
  are optimised so that f(G(z)) matches, one net per target (grouped convs);
  meant for real images on a GPU;
* ``learned``: a feature decoder trained on ~60 augmented copies of every
  public image (:mod:`attacks.inversion.learned`), then pixel refinement against the
  target with a scale-free loss, the setting chosen on public simulations;
* ``set``: for a mean of n records (n read off the released count, when
  the counts are released without noise; one image otherwise), a set
  decoder returns n images, refined jointly so that their mean feature
  matches the target (:mod:`attacks.inversion.learned`);
* ``joint``: the set attacker a server would run (:mod:`attacks.inversion.joint`):
  search the public bank for the n class images whose mean feature best
  matches the released mean, optimise n latent codes of the feature decoder
  jointly so that the decoded images' mean feature (and, where the client's
  second moment G is released, their second moment) matches, keep the
  candidate with the lowest feature residual and polish its pixels jointly;
  n is the rounded released count.

Sources (``source=``): ``mean`` inverts every released class mean;
``second`` first unmixes each client's second moment G_k (with its class
sums and counts, :mod:`attacks.second_moments.unmixing`) into per-sample features and
inverts each (the two-stage attack).

Scoring (:meth:`FeatureInversion.score`): per released cell, the
reconstructions are matched one-to-one to the cell's true images
(Hungarian, squared error) and so is the n-guess prior (k-means centres of
the public class, as many guesses as reconstructions); PSNR is capped at
:data:`PSNR_CAP`; identification is per true image (its matched
reconstruction's nearest private image is that image), so n reconstructions
of a mean of n can identify every record; SSIM uses 3x3 windows; standard
errors treat the cell, not the image, as the independent unit.

The optimising backends live in :mod:`attacks.inversion.backends`, the
result and its scoring in :mod:`attacks.inversion.scoring` (their public
names are re-exported here).
"""

from __future__ import annotations

import numpy as np

from attacks.base import Attack
from attacks.inversion.backends import (
    invert_dip,
    invert_pixels,
    reconstruction_features,
    total_variation,
    train_decoder,
)
from attacks.inversion.determinism import deterministic
from attacks.inversion.scoring import (
    PSNR_CAP,
    SSIM_WIN,
    InversionResult,
    challenge_cells,
    prior_guesses,
    score_inversion,
)
from attacks.params import check_params
from attacks.second_moments.unmixing import unmix
from attacks.view import GroundTruth, ServerView
from privfed.errors import ConfigError, InputError

__all__ = [
    "BACKENDS",
    "PSNR_CAP",
    "SSIM_WIN",
    "SOURCES",
    "FeatureInversion",
    "InversionResult",
    "challenge_cells",
    "prior_guesses",
    "score_inversion",
    "invert_dip",
    "invert_pixels",
    "total_variation",
    "train_decoder",
]

BACKENDS = ("pixel", "decoder", "dip", "learned", "set", "joint")
SOURCES = ("mean", "second")


class FeatureInversion(Attack):
    """Invert released class means (or unmixed per-sample features) through the known backbone.

    Attacker knowledge: the released statistics of the view, the frozen
    backbone and the public split's labelled images (``PublicData``); the
    learned backends train only on the public data.
    """

    name = "inversion"
    requires = frozenset({"counts", "sums", "backbone", "public_images"})
    defaults = {
        "backend": "pixel",
        "source": "mean",
        "steps": 300,
        "lr": 0.1,
        "tv": 0.005,
        "anchor": 0.0,
        "loss": "auto",
        "max_cells": 40,
        "max_count": None,
        "max_samples": 8,
        "decoder_epochs": 400,
        "dip_steps": 500,
        "refine": "auto",
        "max_set": 8,
        "bank_copies": 60,
        "train_steps": 12000,
        "hidden": 512,
        "refine_steps": None,
        "feature_steps": 20000,
        "joint_restarts": 24,
        "joint_candidates": 4,
        "joint_steps": 300,
        "joint_lr": 0.02,
        "joint_lrs": None,  # several latent learning rates, the lowest residual kept per cell (joint_lr otherwise)
        "polish_steps": 200,
        "max_joint": 16,
    }

    @property
    def knowledge(self) -> str:
        """What this attacker uses, in words."""
        b = self.params["backend"]
        what = {
            "pixel": "pixel optimisation with TV from the public class-mean image",
            "decoder": "MLP decoder trained on the public (feature, image) pairs",
            "dip": "deep image prior",
            "learned": f"feature decoder trained on {self.params['bank_copies']} augmented copies of every public "
            f"image, refinement {self.params['refine']!r}",
            "set": f"set decoder (mean of n -> n images, n from the counts, up to {self.params['max_set']}) trained "
            f"on public n-subsets, joint refinement {self.params['refine']!r}",
            "joint": f"search of the public bank ({self.params['bank_copies']} augmented copies of every public "
            f"image) for the n images whose mean feature matches (n from the rounded counts, up to "
            f"{self.params['max_joint']}; one image beyond), n latent codes of the feature decoder optimised jointly "
            f"(Adam, learning rate {'/'.join(f'{lr:g}' for lr in self._joint_lrs())}; {self.params['joint_restarts']} "
            f"search starts, {self.params['joint_candidates']} candidates, the lowest residual kept) against the "
            "released mean (and the "
            f"client's second moment where released), joint pixel polish",
        }[b]
        return f"backbone + public images + released {self.params['source']}: {what}"

    def _validate_params(self) -> None:
        p = self.params
        if p["backend"] not in BACKENDS:
            raise ConfigError(f"unknown inversion backend {p['backend']!r}; choose from {list(BACKENDS)}")
        if p["loss"] not in ("auto", "l2", "cosine"):
            raise ConfigError(f"loss must be 'auto', 'l2' or 'cosine', got {p['loss']!r}")
        if p["source"] not in SOURCES:
            raise ConfigError(f"unknown inversion source {p['source']!r}; choose from {list(SOURCES)}")
        from attacks.inversion.learned import REFINEMENTS

        if not isinstance(p["refine"], str) or (p["refine"] != "auto" and p["refine"] not in REFINEMENTS):
            raise ConfigError(f"unknown refinement {p['refine']!r}; choose from {['auto', *REFINEMENTS]}")
        lrs_given = p["joint_lrs"]
        if lrs_given is not None and not isinstance(lrs_given, (list, tuple)):  # 0.1 or an array: no list
            raise ConfigError(f"joint_lrs must be a list of learning rates (or None), got {lrs_given!r}")
        if lrs_given is not None and not lrs_given:
            raise ConfigError("joint_lrs must list at least one learning rate (or be None: joint_lr alone)")
        lrs = {f"joint_lrs[{i}]": v for i, v in enumerate(p["joint_lrs"] or ())}
        counts = (
            "steps max_cells max_samples decoder_epochs dip_steps max_set bank_copies train_steps hidden "
            "refine_steps feature_steps joint_restarts joint_candidates max_joint"
        )
        check_params(  # NaN, -1 or text reached torch's or scipy's errors (lr, tv, anchor) or ran (max_count)
            {**p, **lrs},
            positive=["lr", "joint_lr", *lrs, "max_count"],  # max_count: a bound on released counts
            nonnegative=["tv", "anchor"],
            counts={**dict.fromkeys(counts.split(), 1), "joint_steps": 0, "polish_steps": 0},
            optional=["refine_steps", "max_count"],
        )

    def _joint_lrs(self) -> tuple:
        p = self.params
        return tuple(float(x) for x in (p["joint_lrs"] or (p["joint_lr"],)))

    def check(self, view: ServerView) -> None:
        super().check(view)
        if self.params["source"] == "second":
            view.require({"second", "per_client"}, f"{self.name} (source='second')")

    # -- attack ----------------------------------------------------------------
    def _cells(self, view: ServerView, rng: np.random.Generator):
        counts = view.stats.counts
        ok = counts >= 0.5
        if self.params["max_count"] is not None:
            ok &= counts <= float(self.params["max_count"]) + 0.5
        rows, classes = np.nonzero(ok)
        m = int(self.params["max_cells"])
        if rows.size > m:
            pick = np.sort(rng.choice(rows.size, size=m, replace=False))
            rows, classes = rows[pick], classes[pick]
        return rows, classes

    def decoder_config(self):
        from attacks.inversion.learned import DecoderConfig

        p = self.params
        return DecoderConfig(
            copies=int(p["bank_copies"]),
            steps=int(p["train_steps"]),
            hidden=int(p["hidden"]),
            feature_steps=int(p["feature_steps"]),
        )

    def _refinement(self, view: ServerView, decode, n: int, key: str) -> tuple | None:
        """The refinement setting for means of n: the parameter, or the one best on public simulations (cached)."""
        from attacks.inversion.learned import REFINEMENTS, select_refinement
        from privfed.data.cache import cached_arrays

        choice = self.params["refine"]
        if choice == "auto":
            names = sorted(REFINEMENTS) if n > 1 else sorted(k for k in REFINEMENTS if k != "anchored")

            def compute():
                best, scores = select_refinement(view.backbone, view.public, decode, n, options=names)
                return {"best": np.array(names.index(best)), "psnr": np.array([scores[k] for k in names])}

            got, _, _ = cached_arrays(
                "attack-refinement",
                {
                    "artefact": "refinement-choice",
                    "decoder": key,
                    "n": int(n),
                    "options": names,
                    "version": 1,
                },
                compute,
            )
            choice = names[int(got["best"])]
        return REFINEMENTS[choice]

    def _learned(self, view: ServerView, targets, classes, counts, rng) -> tuple[np.ndarray, np.ndarray]:
        """Learned / set backends: (images (R, H, W), cell index of each image (R,))."""
        from attacks.inversion.learned import feature_decoder, refine_set, set_decoder

        cfg = self.decoder_config()
        C = view.num_classes
        seed = int(rng.integers(2**31))
        r = np.ones(len(targets), dtype=np.int64)
        noisy_counts = view.noise.count_kind is not None or view.noise.sigma.get("counts", 0.0) > 0.25
        if self.params["backend"] == "set" and not noisy_counts:  # n is known only from exact counts
            r = np.rint(np.maximum(counts, 1.0)).astype(np.int64)
            r[r > int(self.params["max_set"])] = 1  # beyond the largest set decoder: one image per cell
        per_cell: list = [None] * len(targets)
        for k in np.unique(r):
            idx = np.flatnonzero(r == k)
            if k == 1:
                dec = feature_decoder(view.backbone, view.public, C, cfg)

                def decode(m, c, dec=dec):
                    return dec(m, c)[:, None]
            else:
                dec = set_decoder(view.backbone, view.public, C, int(k), cfg)
                decode = dec
            init = decode(targets[idx], classes[idx])
            spec = self._refinement(view, decode, int(k), dec.key)
            steps = (
                None
                if spec is None
                else spec[0]
                if self.params["refine_steps"] is None
                else int(self.params["refine_steps"])
            )
            out = (
                init
                if spec is None
                else refine_set(
                    view.backbone,
                    targets[idx],
                    init,
                    steps=steps,
                    tv=spec[1],
                    anchor=spec[2] if k > 1 else 0.0,
                    seed=seed,
                )
            )
            for j, i in enumerate(idx):
                per_cell[i] = out[j]
        cell = np.concatenate([[i] * len(per_cell[i]) for i in range(len(targets))]).astype(np.int64)
        return np.concatenate(per_cell), cell

    def _joint(self, view: ServerView, targets, classes, counts, rows, rng) -> tuple[np.ndarray, np.ndarray]:
        """Joint backend: (images (R, H, W), cell index of each image (R,))."""
        from attacks.inversion.joint import JointConfig, invert_joint
        from attacks.inversion.learned import feature_decoder, progress_bar, public_bank

        p = self.params
        cfg = self.decoder_config()
        dec = feature_decoder(view.backbone, view.public, view.num_classes, cfg)
        bank = public_bank(view.backbone, view.public, cfg)
        noisy_counts = view.noise.count_kind is not None or view.noise.sigma.get("counts", 0.0) > 0.25
        ns = np.rint(np.maximum(counts, 1.0)).astype(np.int64)
        ns[ns > int(p["max_joint"])] = 1  # beyond the largest joint search: one image per cell (the mean's)
        seconds = None
        if view.per_client and "second" in view.available and rows is not None:
            # G_k is the client's, over all its classes: matched only where the client holds this class alone
            G = view.second_moments()
            seconds = np.zeros((len(targets), G.shape[-1], G.shape[-1]))
            for j, (k, c) in enumerate(zip(rows, classes)):
                others = np.delete(view.stats.counts[k], c)
                if np.all(others < 0.5):
                    seconds[j] = G[k]
        jcfg = JointConfig(
            restarts=int(p["joint_restarts"]),
            candidates=int(p["joint_candidates"]),
            latent_steps=int(p["joint_steps"]),
            latent_lrs=self._joint_lrs(),
            polish_steps=int(p["polish_steps"]),
            max_n=int(p["max_joint"]),
        )
        with progress_bar(
            len(targets), "attacking cells (joint: bank search, then joint decoding and polish)", unit="cell"
        ) as bar:
            per_cell = invert_joint(
                view.backbone,
                dec,
                bank,
                targets,
                classes,
                ns,
                rng,
                jcfg,
                seconds=seconds,
                cosine=noisy_counts,
                progress=bar.update,
            )
        cell = np.concatenate([[i] * len(per_cell[i]) for i in range(len(targets))]).astype(np.int64)
        return np.concatenate(per_cell), cell

    def _invert(self, view: ServerView, targets, classes, counts, rng: np.random.Generator, rows=None):
        """(images (R, H, W), cell index of each image (R,))."""
        prior = view.public.class_mean_images(view.num_classes)
        init = prior[classes]
        b = self.params["backend"]
        if b in ("learned", "set"):
            return self._learned(view, targets, classes, counts, rng)
        if b == "joint":
            return self._joint(view, targets, classes, counts, rows, rng)
        seed = int(rng.integers(2**31))
        one = np.arange(len(targets))
        loss = self.params["loss"]
        if loss == "auto":  # noisy counts scale the released means at random: match directions only
            noisy_counts = view.noise.count_kind is not None or view.noise.sigma.get("counts", 0.0) > 0
            loss = "cosine" if noisy_counts else "l2"
        with deterministic(seed):  # one seeded torch thread: the same images on any machine
            return self._optimise(view, targets, classes, counts, init, prior, loss, seed), one

    def _optimise(self, view: ServerView, targets, classes, counts, init, prior, loss: str, seed: int):
        """The pixel, decoder and deep-image-prior backends: images (R, H, W), one per target."""
        b = self.params["backend"]
        if b == "pixel":
            return invert_pixels(
                view.backbone,
                targets,
                init,
                steps=self.params["steps"],
                lr=self.params["lr"],
                tv=self.params["tv"],
                anchor=self.params["anchor"],
                loss=loss,
                seed=seed,
            )
        if b == "decoder":
            # Noise-aware: the per-coordinate noise std of the released means (sigma_sums / count).
            tau = float(np.median(view.noise.sigma.get("sums", 0.0) / np.maximum(counts, 1.0)))
            dec = train_decoder(
                view.public.features,
                view.public.images,
                view.public.labels,
                epochs=self.params["decoder_epochs"],
                noise=tau,
                num_classes=view.num_classes,
                seed=seed,
            )
            return dec(targets, classes)
        return invert_dip(
            view.backbone, targets, prior.shape[1:], steps=self.params["dip_steps"], loss=loss, seed=seed
        )

    def run(self, view: ServerView, rng: np.random.Generator, *, cells=None, **_) -> InversionResult:
        """Invert released cells.

        ``cells``: optional (rows, classes) to attack (the challenge: e.g. the
        cells that truly hold data); by default every cell whose released
        count is at least 0.5 (at most ``max_cells``, drawn at random).
        With ``source="second"`` the rows are clients to unmix.
        """
        self.check(view)
        st = view.stats
        if self.params["source"] == "mean":
            if cells is None:
                rows, classes = self._cells(view, rng)
            else:
                rows, classes = (np.asarray(a, dtype=np.int64) for a in cells)
            if rows.size == 0:
                raise InputError("no released class mean to invert (every count is below 0.5)")
            n = np.maximum(st.counts[rows, classes], 1.0)
            targets = st.sums[rows, classes] / n[:, None]
            counts = n
            group_by_class = True
        else:
            n_k = np.rint(np.maximum(st.counts, 0)).sum(axis=1).astype(int)
            cand = np.flatnonzero((n_k >= 1) & (n_k <= int(self.params["max_samples"])))
            if cells is not None:
                cand = np.intersect1d(cand, np.asarray(cells[0], dtype=np.int64))
            cand = cand[: int(self.params["max_cells"])]
            if cand.size == 0:
                raise InputError(
                    f"no client's released counts total 1..{self.params['max_samples']}: none to unmix"
                )
            r_rows, r_cls, r_t = [], [], []
            G = view.second_moments()
            for k in cand:
                f, lab, _ = unmix(G[k], int(n_k[k]), rng=rng, sums=st.sums[k], counts=st.counts[k])
                r_rows += [k] * f.shape[0]
                r_cls += list(lab)
                r_t.append(f)
            rows, classes, targets = np.array(r_rows), np.array(r_cls), np.concatenate(r_t)
            counts = np.ones(rows.size)
            group_by_class = False
        targets = np.maximum(targets, 0.0)  # post-ReLU features are non-negative; noise is not
        images, cell = self._invert(
            view, targets, classes, counts, rng, rows if self.params["source"] == "mean" else None
        )
        rows, classes, targets = rows[cell], classes[cell], targets[cell]
        rf = reconstruction_features(view.backbone, images)
        baseline = self._baseline(view, rows, classes, group_by_class)
        owners = rows if st.owners is None else st.owners[rows]
        return InversionResult(
            images=np.asarray(images, np.float32),
            baseline=baseline,
            targets=targets,
            rows=rows,
            owners=owners,
            classes=classes,
            group_by_class=group_by_class,
            per_client=view.per_client,
            recon_features=rf,
            attacker=self.knowledge,
        )

    @staticmethod
    def _baseline(view: ServerView, rows, classes, group_by_class: bool) -> np.ndarray:
        """The prior with as many guesses as reconstructions: per cell, k-means centres of the public class.

        (For the two-stage source the cell is the client; its guesses are the
        class-mean images of the recovered classes.)
        """
        pub = view.public
        prior = pub.class_mean_images(view.num_classes)
        out = np.empty((len(rows), *prior.shape[1:]), np.float32)
        if not group_by_class:
            out[:] = prior[classes]
            return out
        keys = rows.astype(np.int64) * view.num_classes + classes
        cache: dict = {}
        for key in np.unique(keys):
            idx = np.flatnonzero(keys == key)
            c = int(classes[idx[0]])
            k = idx.size
            if (c, k) not in cache:
                cache[(c, k)] = prior[c][None] if k == 1 else prior_guesses(pub.images, pub.labels, c, k)
            g = cache[(c, k)]
            out[idx] = g[np.arange(k) % g.shape[0]]
        return out

    # -- scoring -----------------------------------------------------------------
    def score(self, result: InversionResult, truth: GroundTruth) -> dict:
        """Hungarian-matched scores per cell, cluster standard errors over cells (:func:`score_inversion`)."""
        return score_inversion(result, truth)

    def evaluate(self, view: ServerView, truth: GroundTruth, rng: np.random.Generator) -> dict:
        """Challenge: up to ``max_cells`` released cells that truly hold data (drawn at random)."""
        return self.score(
            self.run(view, rng, cells=challenge_cells(view, truth, rng, self.params["max_cells"])), truth
        )

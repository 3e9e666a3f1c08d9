"""Learned inversion: decoders trained on the attacker's public data, then refined against the target.

This module gathers the public names of :mod:`attacks.inversion.bank` (the augmented
bank and the configuration), :mod:`attacks.inversion.decoders` (the feature and set
decoders), :mod:`attacks.inversion.refine` (refinement and its choice),
:mod:`attacks.inversion.determinism` and :mod:`attacks.inversion.progress`.

What the attacker knows (attacks.md, "Threat model as data"): the frozen
backbone f and the public split's labelled images.  Nothing here reads a
private record.

* :func:`augment_bank`: many augmented copies of every public image
  (random affine maps, smooth elastic displacements, same-class blends),
  so that a decoder sees far more (feature, image) pairs than the public
  split holds (the public split alone is ~540 images of 8x8 digits).
* :func:`feature_decoder`: an MLP from [f / ||f||, class one-hot] to the
  image (Dosovitskiy & Brox, CVPR 2016), trained on the bank's pairs.
  The input is scale-free, so a mean whose count is noisy (hence whose scale
  is wrong) decodes as well as a clean one.
* :func:`set_decoder`: for a mean of n records (n is public from the
  counts), an MLP from the normalised mean feature and the class to n
  images, trained on random same-class n-subsets (half of them of real
  public images, half of bank images, so real images weigh as much as the
  augmented bank) with a Hungarian-matched loss: the order of the n
  outputs is free.
* :func:`refine_pixels` / :func:`refine_set`: pixel-space refinement of a
  decoder's output against the target with a scale-free (cosine) loss on
  the feature, optionally with total variation; for a set, the n images
  are refined jointly so that the mean of their features matches.  Which
  refinement to use is chosen on *public* simulations (:func:`select_refinement`),
  never on the targets.

Trained decoders are cached on disk (:func:`privfed.data.cache.cached_arrays`),
keyed by the SHA-256 of everything that determines them: the backbone's
weights, the public images and labels, the hyper-parameters, torch's version.
Training is deterministic on a given torch build: seeded, on one torch
thread (a matrix product's summation order depends on the thread count, so
a decoder trained on 2 threads differs from one trained on 4) and with
torch's deterministic algorithms, all inside a context that restores the
caller's settings (:func:`deterministic`).  The feature decoder trains until
its validation loss (held-out public images and their augmented copies)
stops improving; the loss and the steps taken are stored with it.
"""

from __future__ import annotations

from attacks.inversion.bank import DecoderConfig, augment_bank, backbone_digest, public_bank
from attacks.inversion.decoders import (
    SET_VALIDATION_SUBSETS,
    VALIDATION_EVERY,
    VERSION,
    FeatureDecoder,
    SetDecoder,
    feature_decoder,
    set_decoder,
    set_validation,
    train_until_stopped,
)
from attacks.inversion.determinism import deterministic
from attacks.inversion.progress import progress_bar, progress_bars
from attacks.inversion.refine import REFINEMENTS, refine_pixels, refine_set, select_refinement

__all__ = [
    "REFINEMENTS",
    "SET_VALIDATION_SUBSETS",
    "VALIDATION_EVERY",
    "VERSION",
    "DecoderConfig",
    "FeatureDecoder",
    "SetDecoder",
    "augment_bank",
    "backbone_digest",
    "deterministic",
    "feature_decoder",
    "progress_bar",
    "progress_bars",
    "public_bank",
    "refine_pixels",
    "refine_set",
    "select_refinement",
    "set_decoder",
    "set_validation",
    "train_until_stopped",
]

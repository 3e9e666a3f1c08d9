"""The digits backbone's forward pass in numpy, and the float32 rounding bound it is tested against.

The embedded default's backbone (conv3x3(16)-ReLU-conv3x3(32)-ReLU-maxpool2-
linear(64)-ReLU, see :class:`privfed.data.digits.DigitsCNN`) is small enough
to run without torch: its shipped weights are plain arrays in
``privfed/data/digits_cnn_seed0.npz``.  :func:`forward` computes the same
64-dimensional features as the torch module, so the light install (no torch)
runs the main job.

The two forward passes compute the same sums of products in float32, in a
different order, so they agree up to float32 rounding, and
:func:`float32_error_bound` says how far: the standard forward error bound of
a float32 dot product of length ``k`` (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., Sec. 3.1: ``|fl(w.x + b) - (w.x + b)| <=
gamma_{k+1} (|w|.|x| + |b|)`` with ``gamma_n = n u / (1 - n u)``, ``u =
2**-24``), carried through the layers (an input error ``e`` adds ``|W| e``; ReLU
and max-pooling are 1-Lipschitz in each entry, so they add nothing).  It holds
for any summation order and with fused multiply-adds, so it bounds torch's
kernels, numpy's BLAS and any batching of either against exact arithmetic.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["LAYERS", "float32_error_bound", "forward"]

#: Parameter names of the backbone, in the order the layers run.
LAYERS = ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias")

_U32 = 2.0**-24  # unit roundoff of float32


def _gamma(n: int, u: float = _U32) -> float:
    return n * u / (1.0 - n * u)


def _patches(x: np.ndarray) -> np.ndarray:
    """(N, C, 8, 8) -> (N, 8, 8, C * 9): the 3x3 neighbourhoods of a padding-1 convolution."""
    n, c, h, w = x.shape
    padded = np.zeros((n, c, h + 2, w + 2), dtype=x.dtype)
    padded[:, :, 1:-1, 1:-1] = x
    win = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # (N, C, H, W, 3, 3)
    return np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(n, h, w, c * 9)


def _conv(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    out = _patches(x) @ weight.reshape(weight.shape[0], -1).T + bias  # (N, H, W, C_out)
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))


def _pool(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def _check(weights, images) -> tuple[dict, np.ndarray]:
    from privfed.errors import InputError

    fix = "pass the arrays of load_shipped_weights()"
    if not hasattr(weights, "keys") or not hasattr(weights, "__getitem__"):
        raise InputError(
            f"backbone weights must map layer names to arrays, got {type(weights).__name__}; {fix}"
        )
    missing = [k for k in LAYERS if k not in weights]
    if missing:
        raise InputError(f"backbone weights lack {missing}; {fix}")
    shapes = {k: np.shape(weights[k]) for k in LAYERS}
    c1 = shapes["conv1.weight"][0] if len(shapes["conv1.weight"]) == 4 else -1
    c2 = shapes["conv2.weight"][0] if len(shapes["conv2.weight"]) == 4 else -1
    d = shapes["fc.weight"][0] if len(shapes["fc.weight"]) == 2 else -1
    want = {  # two 3 x 3 convolutions on 8 x 8 pixels, a 2 x 2 pooling, one linear layer
        "conv1.weight": (c1, 1, 3, 3),
        "conv1.bias": (c1,),
        "conv2.weight": (c2, c1, 3, 3),
        "conv2.bias": (c2,),
        "fc.weight": (d, c2 * 16),
        "fc.bias": (d,),
    }
    for k in LAYERS:
        if min(c1, c2, d) < 1 or shapes[k] != want[k]:
            raise InputError(
                f"backbone weight {k!r} has shape {shapes[k]}, which does not fit the others; {fix}"
            )
        if np.asarray(weights[k]).dtype.kind not in "biuf" or not np.isfinite(weights[k]).all():
            raise InputError(f"backbone weight {k!r} must hold finite real numbers; {fix}")
    return weights, digit_images(images)


def digit_images(images) -> np.ndarray:
    """``images`` as an (N, 1, 8, 8) array of real pixel values in [0, 1], or InputError: the rule of both digits
    forwards (this module's and torch's, :func:`privfed.data.digits.extract_features`), so that they take the
    same images."""
    from privfed.errors import InputError

    arr = np.asarray(images)
    if arr.dtype.kind not in "biuf":  # complex would lose its imaginary part, objects and text are no pixels
        raise InputError(f"images must be real pixel values in [0, 1], got dtype {arr.dtype}")
    if arr.ndim == 3:
        arr = arr[:, None]
    if arr.ndim != 4 or arr.shape[1:] != (1, 8, 8):
        raise InputError(f"images must have shape (N, 8, 8) or (N, 1, 8, 8), got {np.shape(images)}")
    check_pixels(arr)
    return arr


def pixel_problem(arr: np.ndarray) -> tuple[float, float, str] | None:
    """None when ``arr`` holds finite pixel values in [0, 1]; else its (min, max), both NaN when a pixel is not
    finite, and a hint for the usual mistake (scikit-learn's 0..16 digits), else "".  The one rule of the digits
    forwards (numpy and torch) and the attacks' images, each wording its own refusal."""
    if arr.size == 0:
        return None
    if not np.isfinite(arr).all():
        return math.nan, math.nan, ""
    lo, hi = float(arr.min()), float(arr.max())
    if 0 <= lo and hi <= 1:
        return None
    sixteen = 0 <= lo and hi <= 16  # above 1 here
    return lo, hi, "scikit-learn's load_digits() images are 0..16: divide them by 16" if sixteen else ""


def check_pixels(arr: np.ndarray) -> None:
    """Refuse images that are not finite pixel values in [0, 1] (both digits forwards, numpy and torch)."""
    from privfed.errors import InputError

    problem = pixel_problem(arr)
    if problem is not None:
        lo, hi, hint = problem
        bad = "NaN/inf values" if math.isnan(lo) else f"values in [{lo:g}, {hi:g}]"
        raise InputError(f"images must be pixel values in [0, 1], got {bad}" + (f"; {hint}" if hint else ""))


def forward(weights, images, dtype=np.float32) -> np.ndarray:
    """Features of ``images`` through the digits backbone with weights ``weights``, without torch.

    Parameters
    ----------
    weights : mapping of str to ndarray
        The backbone's parameters by torch name (:data:`LAYERS`), e.g.
        :func:`privfed.data.digits.load_shipped_weights`.
    images : ndarray, shape (N, 8, 8) or (N, 1, 8, 8)
        Pixel values in [0, 1].
    dtype : numpy dtype
        Arithmetic precision: float32 (default) is what torch computes;
        float64 gives the exact features up to float64 rounding.

    Returns
    -------
    ndarray, shape (N, 64), float64
        Within :func:`float32_error_bound` of the exact features when
        ``dtype`` is float32.
    """
    weights, x = _check(weights, images)
    if np.dtype(dtype) not in (np.float32, np.float64):
        from privfed.errors import ConfigError

        raise ConfigError(
            f"dtype must be float32 (torch's arithmetic) or float64 (exact), got {np.dtype(dtype)}"
        )
    if x.shape[0] == 0:  # no images: no features (the patches of none cannot be reshaped)
        return np.zeros((0, np.shape(weights["fc.weight"])[0]))
    w = {k: np.asarray(weights[k], dtype=dtype) for k in LAYERS}
    x = np.asarray(x, dtype=dtype)
    h = np.maximum(_conv(x, w["conv1.weight"], w["conv1.bias"]), 0)
    h = _pool(np.maximum(_conv(h, w["conv2.weight"], w["conv2.bias"]), 0))
    out = np.maximum(h.reshape(h.shape[0], -1) @ w["fc.weight"].T + w["fc.bias"], 0)
    return out.astype(np.float64)


def float32_error_bound(weights, images) -> np.ndarray:
    """Per-feature bound on ``|float32 forward - exact forward|`` for any summation order.

    Computed in float64 from the exact activations ``a`` and the carried
    error ``e`` of each layer's input: ``e_out = |W| e_in + gamma_{k+1}
    (|W| (|a| + e_in) + |b|)`` with ``k`` the dot-product length (9, 144,
    512); the images themselves are exact in float32 (grey levels / 16).
    Two float32 computations (torch and numpy, or two batchings) therefore
    differ by at most twice this bound.

    Returns
    -------
    ndarray, shape (N, 64), float64
    """
    weights, x = _check(weights, images)
    if x.shape[0] == 0:  # no images: no features (the patches of none cannot be reshaped)
        return np.zeros((0, np.shape(weights["fc.weight"])[0]))
    w = {k: np.asarray(weights[k], dtype=np.float64) for k in LAYERS}
    a = np.asarray(x, dtype=np.float64)
    e = np.zeros_like(a)

    def conv_layer(a, e, W, b):
        k = W[0].size + 1
        absW = np.abs(W)
        z = _conv(a, W, b)
        err = _conv(e, absW, np.zeros_like(b)) + _gamma(k) * (_conv(np.abs(a) + e, absW, np.abs(b)))
        return z, err

    z, e = conv_layer(a, e, w["conv1.weight"], w["conv1.bias"])
    a = np.maximum(z, 0)
    z, e = conv_layer(a, e, w["conv2.weight"], w["conv2.bias"])
    a = np.maximum(z, 0)
    # max-pooling: the pooled value moves by at most the largest error in its window
    a, e = _pool(a), _pool(e)
    a, e = a.reshape(a.shape[0], -1), e.reshape(e.shape[0], -1)
    W, b = w["fc.weight"], w["fc.bias"]
    k = W.shape[1] + 1
    absW = np.abs(W)
    return e @ absW.T + _gamma(k) * ((np.abs(a) + e) @ absW.T + np.abs(b))

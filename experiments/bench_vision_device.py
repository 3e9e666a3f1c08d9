"""Benchmark: feature extraction on a CUDA GPU against the CPU, for the two things :mod:`privfed.data.vision`
says about it.

* **Agreement.** The same images through the same backbone, once on the CPU and once on the GPU
  (:func:`privfed.data.vision.extract_dataset_features`, images normalised at 32 pixels and resized to 224
  in batches on the device): the relative difference ``||F_gpu - F_cpu||_F / ||F_cpu||_F`` over the batch,
  and the largest of any one image's ``||f_gpu - f_cpu|| / ||f_cpu||``.  Measured with torch's defaults
  (cuDNN may run float32 convolutions in TF32) and again with TF32 off for convolutions and matrix products.
* **Speed.** The whole extraction (DataLoader, preprocessing, the backbone on the GPU) of ``--images``
  32-pixel images, resized to 224 per image with PIL in the transform (``preprocess(name, 224)``) against
  normalised at 32 pixels and resized in batches on the device (``preprocess(name, None)`` and
  ``resize=224``); wall seconds, the two alternating in ``--repeats`` rounds after one warm-up of each, and
  their median, spread and ratio; ``--runs`` such measurements one after the other, and whether each
  backbone's speed-up reproduces within 10 % across them.

Nothing is downloaded: the backbones are randomly initialised (seeded; no pretrained weights are on the
machine, so the differences are those of the same computation with other weights) and the images are synthetic 32-pixel RGB images (seeded
noise over a smooth pattern), handed to the transform as PIL images, as torchvision's CIFAR data sets do.

It needs a CUDA device and is refused at once without one.  ``--record`` writes
``experiments/results/bench_vision_device.json`` (the docs' quote of it: the ``vision-device`` block of
docs/data.md), again after every run, so a stop keeps the runs that finished.  Run:
``python experiments/bench_vision_device.py [--backbones squeezenet1_1,mobilenet_v2,vit_b_16] [--images 2048]
[--agree-images 128] [--batch-size 128] [--repeats 3] [--runs 2] [--seed 0] [--record]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.attacks_common import markdown  # noqa: E402  (the experiments' one table writer)
from experiments.flag_types import count, name_list, seed  # noqa: E402

BACKBONES = ("squeezenet1_1", "mobilenet_v2", "vit_b_16")
#: The data set whose preprocessing (channel statistics) the images get.
DATASET = "cifar10"
SIZE = 224
#: Two runs' speed-ups must agree within this share to count as reproduced.
REPRODUCE = 0.10


class SyntheticImages:
    """``n`` seeded 32-pixel RGB images as PIL images through ``transform`` (a torch map-style data set)."""

    def __init__(self, n: int, seed: int, transform) -> None:
        rng = np.random.default_rng(seed)
        # a smooth pattern (4 x 4 cells upsampled) plus noise: the content a resize interpolates, not flat
        coarse = rng.uniform(0, 255, size=(n, 4, 4, 3))
        smooth = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)
        self.images = np.clip(smooth + rng.normal(0, 24, size=smooth.shape), 0, 255).astype(np.uint8)
        self.labels = rng.integers(0, 10, size=n)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        from PIL import Image

        return self.transform(Image.fromarray(self.images[i])), int(self.labels[i])


def _set_tf32(cudnn: bool, matmul: bool) -> None:
    import torch

    torch.backends.cudnn.allow_tf32 = cudnn
    torch.backends.cuda.matmul.allow_tf32 = matmul


def _tf32_state() -> dict:
    import torch

    return {
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }


def _difference(cpu: np.ndarray, gpu: np.ndarray) -> dict:
    rows = np.linalg.norm(gpu - cpu, axis=1) / np.maximum(np.linalg.norm(cpu, axis=1), np.finfo(float).tiny)
    return {
        "relative_fro": float(np.linalg.norm(gpu - cpu) / np.linalg.norm(cpu)),
        "max_row_relative": float(rows.max()),
        "median_row_relative": float(np.median(rows)),
    }


def agreement(name: str, images: int, batch: int, seed_: int) -> dict:
    """CPU against GPU features of one backbone, with torch's TF32 defaults and with TF32 off."""
    import torch

    from privfed.data.vision import build_backbone, extract_dataset_features, preprocess

    torch.manual_seed(seed_)
    bb = build_backbone(name, weights=None)
    data = SyntheticImages(images, seed_, preprocess(DATASET, None))
    kw = {"batch_size": batch, "progress": False, "resize": SIZE}
    cpu, _ = extract_dataset_features(data, bb, device="cpu", **kw)
    defaults = _tf32_state()
    gpu_default, _ = extract_dataset_features(data, bb, device="cuda", **kw)
    _set_tf32(False, False)
    try:
        gpu_ieee, _ = extract_dataset_features(data, bb, device="cuda", **kw)
    finally:
        _set_tf32(defaults["cudnn_allow_tf32"], defaults["matmul_allow_tf32"])
    return {
        "backbone": name,
        "dim": int(cpu.shape[1]),
        "images": images,
        "torch_defaults": defaults,
        "defaults": _difference(cpu, gpu_default),
        "tf32_off": _difference(cpu, gpu_ieee),
        "feature_norm_median": float(np.median(np.linalg.norm(cpu, axis=1))),
    }


def speed(name: str, images: int, batch: int, repeats: int, seed_: int) -> dict:
    """Extraction wall seconds on the GPU: PIL resizing per image against resizing in batches on the device."""
    import torch

    from privfed.data.vision import build_backbone, extract_dataset_features, preprocess

    torch.manual_seed(seed_)
    bb = build_backbone(name, weights=None)
    ways = {
        "pil": (SyntheticImages(images, seed_, preprocess(DATASET, SIZE)), None),
        "device": (SyntheticImages(images, seed_, preprocess(DATASET, None)), SIZE),
    }

    def once(way: str, n: int | None = None) -> float:
        data, resize = ways[way]
        if n is not None:
            data = torch.utils.data.Subset(data, range(n))
        torch.cuda.synchronize()
        t = time.perf_counter()
        extract_dataset_features(data, bb, batch_size=batch, device="cuda", progress=False, resize=resize)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    for way in ways:  # warm-up: cuDNN's algorithm choice, the allocator, the loader
        once(way, min(images, 2 * batch))
    samples: dict[str, list[float]] = {w: [] for w in ways}
    for r in range(repeats):
        for way in ways if r % 2 == 0 else reversed(list(ways)):
            samples[way].append(once(way))
    med = {w: statistics.median(s) for w, s in samples.items()}
    return {
        "backbone": name,
        "images": images,
        "batch_size": batch,
        "samples_s": samples,
        "median_s": med,
        "spread": {w: (max(s) - min(s)) / statistics.median(s) for w, s in samples.items()},
        "speedup": med["pil"] / med["device"],
        "images_per_s": {w: images / m for w, m in med.items()},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbones", type=name_list(BACKBONES), default=",".join(BACKBONES))
    p.add_argument("--images", type=count(1), default=2048, help="images per timed extraction")
    p.add_argument("--agree-images", type=count(1), default=128, help="images compared on CPU and GPU")
    p.add_argument("--batch-size", type=count(1), default=128)
    p.add_argument("--repeats", type=count(1), default=3)
    p.add_argument(
        "--runs", type=count(1), default=2, help="whole speed measurements, to check they reproduce"
    )
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--record", action="store_true", help="write experiments/results/bench_vision_device.json")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            "bench_vision_device.py: needs a CUDA device (torch sees none); nothing was measured",
            file=sys.stderr,
        )
        return 2
    import torchvision

    data: dict = {
        "config": {
            "backbones": a.backbones,
            "images": a.images,
            "agree_images": a.agree_images,
            "batch_size": a.batch_size,
            "repeats": a.repeats,
            "runs": a.runs,
            "seed": a.seed,
            "dataset_preprocessing": DATASET,
            "size": SIZE,
            "weights": "random (seeded)",
            "reproduce": REPRODUCE,
        },
        "device": {
            "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "cpu_threads": torch.get_num_threads(),
        },
        "agreement": [],
        "runs": [],
    }
    for name in a.backbones:
        print(f"{name}: agreement on {a.agree_images} images", flush=True)
        data["agreement"].append(agreement(name, a.agree_images, a.batch_size, a.seed))
    _agreement_table(data["agreement"])
    for i in range(a.runs):
        fast = []
        for name in a.backbones:
            print(
                f"run {i + 1} of {a.runs}, {name}: speed on {a.images} images x {a.repeats} repeats",
                flush=True,
            )
            fast.append(speed(name, a.images, a.batch_size, a.repeats, a.seed))
        _speed_table(fast)
        data["runs"].append({"speed": fast})
        data["reproduction"] = reproduction(data["runs"])
        if a.record:  # after every run: a stop keeps the runs that finished
            from experiments import recorded

            cmd = recorded.command("experiments/bench_vision_device.py", argv)
            print(f"recorded {recorded.save('bench_vision_device', data, cmd)} ({i + 1} run(s))")
    for name, r in data["reproduction"].items():
        print(f"{name} speed-up: {[round(v, 2) for v in r['values']]} spread {r['spread']:.1%}")
    return 0


def reproduction(runs: list[dict]) -> dict:
    """Each backbone's speed-up in every run, their spread ((max - min) / min) and whether it is within
    :data:`REPRODUCE` (None with one run: nothing to compare)."""
    out = {}
    for s in runs[0]["speed"]:
        values = [next(x for x in r["speed"] if x["backbone"] == s["backbone"])["speedup"] for r in runs]
        spread = (max(values) - min(values)) / min(values)
        # one run reproduces nothing: not checked (None), never "reproduced"
        out[s["backbone"]] = {
            "values": values,
            "spread": spread,
            "reproduced": spread <= REPRODUCE if len(runs) > 1 else None,
        }
    return out


def _agreement_table(agree: list[dict]) -> None:
    cols = [
        "backbone",
        "d",
        "rel. diff (defaults)",
        "max row (defaults)",
        "rel. diff (TF32 off)",
        "max row (TF32 off)",
    ]
    cells = lambda r: [  # noqa: E731
        r["backbone"],
        r["dim"],
        *(f"{r[k][m]:.2e}" for k in ("defaults", "tf32_off") for m in ("relative_fro", "max_row_relative")),
    ]
    print(markdown([dict(zip(cols, cells(r))) for r in agree], cols))


def _speed_table(fast: list[dict]) -> None:
    cols = ["backbone", "PIL resize s", "device resize s", "speed-up", "spread (PIL, device)"]
    cells = lambda r: [  # noqa: E731
        r["backbone"],
        f"{r['median_s']['pil']:.3f}",
        f"{r['median_s']['device']:.3f}",
        f"{r['speedup']:.2f}",
        f"{r['spread']['pil']:.1%}, {r['spread']['device']:.1%}",
    ]
    print(markdown([dict(zip(cols, cells(r))) for r in fast], cols))


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)

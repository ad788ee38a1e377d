"""2-D maps of points (PCA, t-SNE, UMAP) and rank correlation, shared by the embedding map and
the hidden-state maps.

Example:
    >>> xy, info = reduce(np.random.default_rng(0).normal(size=(30, 5)))
    >>> xy.shape, round(sum(info["explained_variance"]), 2) <= 1.0
    ((30, 2), True)
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from probekit.errors import InputError
from probekit.numerics import one_blas_thread

METHODS = ("pca", "tsne", "umap")
"""Map methods of :func:`reduce`."""


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`METHODS`, else :class:`InputError`."""
    if method not in METHODS:
        raise InputError(f"unknown map method {method!r}", fix=f"use one of {METHODS}")
    return method


def reduce(x: np.ndarray, method: str = "pca", seed: int = 0) -> tuple[np.ndarray, dict]:
    """2-D coordinates of the rows of ``x`` by PCA, t-SNE or UMAP, and method details."""
    check_method(method)
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n < 4:
        raise InputError(f"{n} points are too few for a map", fix="pass at least 4 points")
    with one_blas_thread():  # see numerics.one_blas_thread
        return _coordinates(x, method, seed)


def _coordinates(x: np.ndarray, method: str, seed: int) -> tuple[np.ndarray, dict]:
    n = x.shape[0]
    if method == "pca":
        from sklearn.decomposition import PCA

        pca = PCA(n_components=2, random_state=seed).fit(x)
        return pca.transform(x), {"explained_variance": pca.explained_variance_ratio_.tolist()}
    if method == "tsne":
        from sklearn.manifold import TSNE

        perplexity = float(min(30, max(2, (n - 1) // 3)))
        xy = TSNE(
            n_components=2, perplexity=perplexity, random_state=seed, init="pca"
        ).fit_transform(x)
        return xy, {"perplexity": perplexity}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import umap

        n_neighbors = int(min(15, n - 1))
        xy = umap.UMAP(n_components=2, n_neighbors=n_neighbors, random_state=seed).fit_transform(x)
    return np.asarray(xy), {"n_neighbors": n_neighbors}


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two 1-D arrays (0 when either is constant)."""
    ra = pd.Series(a).rank().to_numpy()
    rb = pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


__all__ = ["METHODS", "check_method", "reduce", "spearman"]

"""Linear probes: which task variable can be read linearly from which layer and position?

For every site (the residual stream before each layer and after the last, and each layer's
attention and MLP outputs), every position and every variable, a scikit-learn probe is trained
on a random 75% of the sequences and scored on the rest: logistic regression for *class*
variables (held-out accuracy), ridge regression for *value* variables (held-out R^2). The same
probe is trained again on randomly permuted labels (the control task); *selectivity* is the
probe's score minus the control's, so a probe that only memorizes scores near zero.

A variable is *decodable* at a (site, layer, position) when its score is at least ``threshold``
(default 0.8) and its selectivity at least ``min_selectivity`` (default 0.2). ``first_layer``
is the smallest residual depth (0 = embeddings, l = the input of layer l, L = the final
residual) at which some position decodes it: where in depth a composite is computed step by
step (inferential: g(x; a1) appears before the target) or looked up at once (symmetric).

On anchor-task data (:class:`~probekit.tasks.anchor.AnchorData`) the variables default to the
``key``, ``a1``, ``a2``, the intermediate ``g1`` = g(x; a1) and the ``target``, all as classes;
any model takes user labels (one per sequence).

Activations are gathered one site and layer at a time over all batches (``[n, pos, d_model]``
for that site only), probed, and dropped before the next site.

Example:
    >>> res = linear_probes(model, task.dataset("test_data"), task=task)   # doctest: +SKIP
    >>> res.summary["first_layer_g1"], res.summary["first_layer_target"]     # doctest: +SKIP
    (1, 2)
    >>> res.figure().show()                                                  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probekit import figures
from probekit.errors import ConfigError, InputError
from probekit.model import Model, load
from probekit.result import Result

SITES = ("resid", "attn_out", "mlp_out")
"""Probe sites: ``resid`` at depths 0..L (input of each layer, then the final residual);
``attn_out`` / ``mlp_out`` (each layer's sublayer output) at layers 0..L-1."""

KINDS = ("class", "value")
MIN_SAMPLES = 20


class ProbeResult(Result):
    """Held-out probe scores per variable, site, layer and position, with control scores.

    ``df`` columns: ``variable``, ``kind`` (class / value), ``site``, ``layer``, ``position``,
    ``score`` (accuracy or R^2), ``control`` (same probe, shuffled labels), ``selectivity``,
    ``chance`` (majority-class share, 0 for values), ``decodable``, ``n_train``, ``n_test``.
    ``summary``: per variable ``first_layer_<v>`` (smallest residual depth where some position
    decodes it, None if none), ``first_layer_<v>_last`` (same at the last position),
    ``best_score_<v>``, ``best_selectivity_<v>``; ``threshold``, ``min_selectivity``.
    """

    kind = "probes"

    def map(self, variable: str, value: str = "score", site: str = "resid") -> pd.DataFrame:
        """Layers x positions table of ``value`` for one variable and site."""
        part = self.df[(self.df.variable == variable) & (self.df.site == site)]
        if part.empty:
            raise InputError(
                f"no probes of variable {variable!r} at site {site!r}",
                fix=f"use one of {sorted(set(self.df.variable))} and sites "
                f"{sorted(set(self.df.site))}",
            )
        table = part.pivot(index="layer", columns="position", values=value)
        order = [p for p in self.meta.get("positions") or [] if p in table.columns]
        return table[order + [c for c in table.columns if c not in order]]

    def first_layers(self, site: str = "resid") -> pd.DataFrame:
        """Variables x positions table of the first layer (depth) that decodes each variable."""
        part = self.df[(self.df.site == site) & self.df.decodable]
        first = part.groupby(["variable", "position"]).layer.min().unstack("position")
        variables = list(dict.fromkeys(self.df.variable))
        positions = list(dict.fromkeys(self.meta.get("positions") or sorted(set(self.df.position))))
        return first.reindex(index=variables, columns=positions)

    def figure(self, value: str = "score", site: str = "resid") -> go.Figure:
        """One heatmap (layers x positions) per variable, plus the first-decodable-layer map."""
        variables = list(dict.fromkeys(self.df.variable))
        titles = [
            f"{v}: {value} (first decodable depth {self.summary.get('first_layer_' + v)})"
            for v in variables
        ] + ["first decodable depth"]
        cols = min(3, len(variables) + 1)
        rows = -(-(len(variables) + 1) // cols)
        fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles)
        for i, v in enumerate(variables):
            table = self.map(v, value, site)
            fig.add_trace(
                go.Heatmap(
                    z=table.to_numpy(),
                    x=[str(c) for c in table.columns],
                    y=[str(r) for r in table.index],
                    zmin=0,
                    zmax=1,
                    colorscale=figures.SEQUENTIAL,
                    showscale=i == 0,
                    colorbar={"title": {"text": value}, "x": 1.02},
                    hovertemplate=f"{v}<br>position %{{x}}<br>depth %{{y}}<br>{value} %{{z:.3f}}"
                    "<extra></extra>",
                ),
                row=i // cols + 1,
                col=i % cols + 1,
            )
        first = self.first_layers(site)
        fig.add_trace(
            go.Heatmap(
                z=first.to_numpy(dtype=float),
                x=[str(c) for c in first.columns],
                y=list(first.index),
                colorscale="Cividis_r",
                showscale=False,
                text=first.to_numpy(dtype=float),
                texttemplate="%{text}",
                hovertemplate="%{y} at position %{x}: depth %{z}<extra></extra>",
            ),
            row=len(variables) // cols + 1,
            col=len(variables) % cols + 1,
        )
        for r in range(1, rows + 1):
            for c in range(1, cols + 1):
                fig.update_xaxes(title_text="position", row=r, col=c)
        figures.base_layout(
            fig,
            f"Linear probes at site {site!r} ({value}; decodable: score >= "
            f"{self.summary.get('threshold')} and selectivity >= "
            f"{self.summary.get('min_selectivity')})",
        )
        fig.update_layout(height=320 * rows + 60, width=420 * cols)
        return fig


# ---------------------------------------------------------------- labels
def _is_anchor(data: Any) -> bool:
    return all(hasattr(data, a) for a in ("tokens", "targets", "composite", "positions", "pairs"))


def anchor_variables(data: Any, task: Any = None) -> dict[str, np.ndarray]:
    """The anchor task's variables per sequence: key, a1, a2, g1 = g(key; a1), target.

    ``task`` supplies the anchors' shifts (default: the papers' ``AnchorTask()``); it must
    agree with the data's composites.
    """
    from probekit.tasks.anchor import AnchorTask

    task = AnchorTask() if task is None else task
    keys = data.keys.numpy().astype(np.int64)
    a1 = data.pairs[:, 0].numpy().astype(np.int64)
    a2 = data.pairs[:, 1].numpy().astype(np.int64)
    try:
        shift = np.vectorize(lambda a: task.anchors[int(a)])
        g1 = keys + shift(a1)
        composite = g1 + shift(a2)
    except KeyError as err:
        raise ConfigError(
            f"anchor {err} of the data is not an anchor of the task",
            fix="pass task= the AnchorTask that generated the data",
        ) from err
    if not np.array_equal(composite, data.composite.numpy()):
        raise ConfigError(
            "the task's anchor shifts do not reproduce the data's composites",
            fix="pass task= the AnchorTask that generated the data",
        )
    return {
        "key": keys,
        "a1": a1,
        "a2": a2,
        "g1": g1,
        "target": data.targets.numpy().astype(np.int64),
    }


def _labels(
    data: Any, labels: Any, kinds: Mapping[str, str] | None, task: Any, n: int
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    if labels is None:
        if not _is_anchor(data):
            raise InputError(
                "no labels to probe for",
                fix="pass labels={'name': one value per sequence}, or anchor-task data",
            )
        out = anchor_variables(data, task)
    elif isinstance(labels, Mapping):
        out = {str(k): np.asarray(v) for k, v in labels.items()}
    else:
        out = {"label": np.asarray(labels)}
    if not out:
        raise InputError("labels is empty", fix="pass at least one variable")
    kinds = dict(kinds or {})
    result_kinds: dict[str, str] = {}
    for name, values in out.items():
        if values.ndim != 1 or len(values) != n:
            raise InputError(
                f"labels {name!r} have shape {values.shape} for {n} sequences",
                fix="give one label per sequence (a 1-D array of length n)",
            )
        kind = kinds.get(name, "value" if values.dtype.kind == "f" else "class")
        if kind not in KINDS:
            raise InputError(f"unknown kind {kind!r} of {name!r}", fix=f"use one of {KINDS}")
        result_kinds[name] = kind
        if kind == "value" and not np.isfinite(values.astype(float)).all():
            raise InputError(f"labels {name!r} hold NaN or inf", fix="pass finite values")
    unknown = set(kinds) - set(out)
    if unknown:
        raise InputError(
            f"kinds given for unknown variables {sorted(unknown)}",
            fix=f"use names among {sorted(out)}",
        )
    return out, result_kinds


# ---------------------------------------------------------------- activations
@torch.no_grad()
def gather(model: Model, batches: list, hook: str) -> tuple[np.ndarray, np.ndarray]:
    """Activations ``[n, pos, d]`` at one hook over all batches, and the valid mask ``[n, pos]``.

    Only this hook's activations are kept (one site at a time, never every hook at once).
    """
    chunks: list[np.ndarray] = []
    valid: list[np.ndarray] = []

    def keep(tensor: torch.Tensor, hook: Any) -> None:
        chunks.append(tensor.detach().float().cpu().numpy())

    for batch in batches:
        model.forward(batch, [(hook, keep)])
        valid.append(batch.valid.cpu().numpy())
    return np.concatenate(chunks), np.concatenate(valid)


def _site_hooks(model: Model, sites: Sequence[str]) -> list[tuple[str, int, str]]:
    out = []
    for site in sites:
        if site == "resid":
            out += [
                (site, layer, model.hook_name(layer, "resid_in")) for layer in range(model.n_layers)
            ]
            out.append((site, model.n_layers, model.hook_name(model.n_layers - 1, "resid_out")))
        else:
            out += [(site, layer, model.hook_name(layer, site)) for layer in range(model.n_layers)]
    return out


# ---------------------------------------------------------------- fitting
def _probe(kind: str, probe: str, max_iter: int) -> Any:
    from sklearn.linear_model import LogisticRegression, Ridge, RidgeClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if kind == "value":
        est = Ridge(alpha=1.0)
    elif probe == "ridge":
        est = RidgeClassifier(alpha=1.0)
    else:
        est = LogisticRegression(max_iter=max_iter, C=1.0)
    return make_pipeline(StandardScaler(), est)


def fit_probe(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    kind: str = "class",
    probe: str = "logistic",
    max_iter: int = 200,
) -> float:
    """Held-out accuracy (class) or R^2 (value) of one linear probe.

    Example:
        >>> x = np.random.default_rng(0).normal(size=(200, 5))
        >>> y = (x[:, 0] > 0).astype(int)
        >>> fit_probe(x[:150], y[:150], x[150:], y[150:]) > 0.9
        True
    """
    from sklearn.metrics import r2_score

    if kind == "class" and len(np.unique(y_train)) < 2:
        return 1.0 if np.all(y_test == y_train[0]) else float(np.mean(y_test == y_train[0]))
    est = _probe(kind, probe, max_iter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings: the score says enough
        est.fit(x_train, y_train)
    pred = est.predict(x_test)
    if kind == "value":
        return float(r2_score(y_test, pred)) if len(y_test) > 1 else float("nan")
    return float(np.mean(pred == y_test))


def _chance(kind: str, y_train: np.ndarray, y_test: np.ndarray) -> float:
    if kind == "value":
        return 0.0
    values, counts = np.unique(y_train, return_counts=True)
    return float(np.mean(y_test == values[counts.argmax()]))


def linear_probes(
    model: Any,
    data: Any,
    labels: Any = None,
    *,
    kinds: Mapping[str, str] | None = None,
    task: Any = None,
    sites: Sequence[str] = SITES,
    positions: str | Sequence[int] = "all",
    probe: str = "logistic",
    test_size: float = 0.25,
    threshold: float = 0.8,
    min_selectivity: float = 0.2,
    max_iter: int = 200,
    batch_size: int | None = 512,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> ProbeResult:
    """Train linear probes for each variable at every site, layer and position.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: :class:`~probekit.tasks.anchor.AnchorData` or any token data.
        labels: ``{name: one label per sequence}`` (or one array, named 'label'); default for
            anchor data: key, a1, a2, g1, target.
        kinds: ``{name: 'class' | 'value'}``; default 'value' for float labels, else 'class'.
        task: the :class:`~probekit.tasks.anchor.AnchorTask` of anchor data (for g1).
        sites: any of 'resid', 'attn_out', 'mlp_out'.
        positions: 'all', 'last', a list of position indices (negative from the end), or
            'roles' (anchor data: each row's key, anchor1 and anchor2 positions, and the last).
        probe: 'logistic' (default) or 'ridge' (RidgeClassifier, much faster for many classes)
            for class variables; value variables always use ridge regression.
        test_size: held-out share of the sequences.
        threshold, min_selectivity: what counts as decodable (see module docstring).
        seed: seeds the train/test split and the control permutation.
        progress: called with a short text before each site and layer.

    Example:
        >>> res = linear_probes(model, tokens, {"parity": tokens[:, 0] % 2})  # doctest: +SKIP
    """
    model = load(model)
    tokens = data.tokens if _is_anchor(data) else data
    batches = model.prepare(tokens, batch_size)
    n = sum(len(b.tokens) for b in batches)
    variables, var_kinds = _labels(data, labels, kinds, task, n)
    unknown = set(sites) - set(SITES)
    if unknown or not sites:
        raise InputError(f"unknown probe sites {sorted(unknown)}", fix=f"use any of {SITES}")
    if probe not in ("logistic", "ridge"):
        raise InputError(f"unknown probe {probe!r}", fix="use probe='logistic' or 'ridge'")
    if not 0.0 < test_size < 1.0:
        raise InputError(f"test_size {test_size} is not in (0, 1)", fix="use e.g. 0.25")
    n_test = int(round(n * test_size))
    if n < MIN_SAMPLES or n_test < 2 or n - n_test < 2:
        raise InputError(
            f"{n} sequences are too few to train and test a probe",
            fix=f"pass at least {MIN_SAMPLES} sequences (hundreds for many classes)",
        )
    n_pos = batches[0].tokens.shape[1]
    pos_list = _positions(positions, n_pos, _is_anchor(data))
    all_valid = np.concatenate([b.valid.cpu().numpy() for b in batches])
    index = {pos: _row_positions(pos, data, all_valid) for pos in pos_list}
    rows_n = np.arange(n)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    test_idx, train_idx = order[:n_test], order[n_test:]
    shuffled = {name: rng.permutation(v[train_idx]) for name, v in variables.items()}
    rows = []
    for site, layer, hook in _site_hooks(model, sites):
        if progress is not None:
            progress(f"{site} layer {layer}")
        acts, valid = gather(model, batches, hook)
        for pos in pos_list:
            idx = index[pos]
            ok = valid[rows_n, idx]
            tr, te = train_idx[ok[train_idx]], test_idx[ok[test_idx]]
            if len(tr) < 2 or len(te) < 1:
                continue
            x_tr, x_te = acts[tr, idx[tr]], acts[te, idx[te]]
            keep_tr = ok[train_idx]
            for name, values in variables.items():
                kind = var_kinds[name]
                y_tr, y_te = values[tr], values[te]
                score = fit_probe(x_tr, y_tr, x_te, y_te, kind, probe, max_iter)
                control = fit_probe(
                    x_tr, shuffled[name][keep_tr], x_te, y_te, kind, probe, max_iter
                )
                rows.append(
                    {
                        "variable": name,
                        "kind": kind,
                        "site": site,
                        "layer": layer,
                        "position": pos,
                        "score": score,
                        "control": control,
                        "selectivity": score - control,
                        "chance": _chance(kind, y_tr, y_te),
                        "n_train": len(tr),
                        "n_test": len(te),
                    }
                )
        del acts
    df = pd.DataFrame(rows)
    df["decodable"] = (df.score >= threshold) & (df.selectivity >= min_selectivity)
    summary: dict[str, Any] = {"threshold": threshold, "min_selectivity": min_selectivity}
    resid = df[df.site == "resid"]
    for name in variables:
        part = resid[resid.variable == name]
        hits = part[part.decodable]
        summary[f"first_layer_{name}"] = int(hits.layer.min()) if len(hits) else None
        last = hits[hits.position.isin([n_pos - 1, "last"])]
        summary[f"first_layer_{name}_last"] = int(last.layer.min()) if len(last) else None
        every = df[df.variable == name]
        summary[f"best_score_{name}"] = float(every.score.max())
        summary[f"best_selectivity_{name}"] = float(every.selectivity.max())
    meta = {
        "sites": list(sites),
        "positions": pos_list,
        "probe": probe,
        "kinds": var_kinds,
        "test_size": test_size,
        "seed": seed,
        "model": repr(model),
    }
    return ProbeResult(df, summary, meta)


ROLE_OFFSETS = {"key": 0, "anchor1": 1, "anchor2": 2}


def _positions(positions: str | Sequence[int], n_pos: int, anchor: bool) -> list:
    if positions == "all":
        return list(range(n_pos))
    if positions == "last":
        return [n_pos - 1]
    if positions == "roles":
        if not anchor:
            raise InputError(
                "positions='roles' needs anchor-task data",
                fix="pass task.dataset(split), or positions='all' / 'last' / a list",
            )
        return [*ROLE_OFFSETS, "last"]
    if isinstance(positions, str):
        raise InputError(
            f"unknown positions {positions!r}", fix="use 'all', 'last', 'roles' or a list"
        )
    out = []
    for p in positions:
        if not -n_pos <= int(p) < n_pos:
            raise InputError(
                f"position {p} is outside the {n_pos} positions",
                fix=f"use positions in -{n_pos}..{n_pos - 1}",
            )
        out.append(int(p) % n_pos)
    return sorted(set(out))


def _row_positions(pos: int | str, data: Any, valid: np.ndarray) -> np.ndarray:
    """Position index per sequence: fixed, the last real token, or an anchor role's position."""
    if pos == "last":
        return valid.cumsum(-1).argmax(-1)
    if isinstance(pos, str):
        return data.positions.numpy().astype(np.int64) + ROLE_OFFSETS[pos]
    return np.full(len(valid), pos, dtype=np.int64)


__all__ = [
    "KINDS",
    "SITES",
    "ProbeResult",
    "anchor_variables",
    "fit_probe",
    "gather",
    "linear_probes",
]

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

On task data (:class:`~probekit.data.TaskData`) the variables default to the data's
``variables()`` (the anchor task: the ``key``, ``a1``, ``a2``, the intermediate ``g1`` =
g(x; a1) and the ``target``, all as classes); any model takes user labels (one per sequence).

Activations are gathered one site and layer at a time over all batches (``[n, pos, d_model]``
for that site only), probed, and dropped before the next site.

Example:
    >>> from probekit.anchor import AnchorTask
    >>> from probekit.toy import toy_model
    >>> task = AnchorTask(n_train=64, n_test=32, vocab_size=50, item_high=40)
    >>> res = linear_probes(toy_model("gpt2", n_layers=1), task.dataset("test_data"),
    ...                     sites=["resid"], positions="roles", probe="ridge")
    >>> list(res.first_layers().columns)
    ['key', 'anchor1', 'anchor2', 'last']
    >>> res.first_layer("a1")
    0
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probekit import figures
from probekit.analyses.activations import (
    batches_of,
    gather,
    position_list,
    row_positions,
    single_roles,
)
from probekit.analyses.common import DataOrTask, result_meta
from probekit.data import TaskData, check_one_length
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.numerics import one_blas_thread
from probekit.progress import counted
from probekit.result import Result
from probekit.words import AXES, figure_words

PROBE_SITES = ("resid", "attn_out", "mlp_out")
"""The sites a probe reads. ``resid`` is the residual stream at depth d = 0..L: the input of
block d (d = 0: the embeddings), and for d = L the output of the last block (the stream the
head reads); ``attn_out`` / ``mlp_out`` are each block's sublayer outputs at layers 0..L-1."""

KINDS = ("class", "value")
MIN_SAMPLES = 20


class ProbeResult(Result):
    """Held-out probe scores per variable, site, layer and position, with control scores.

    ``df`` columns: ``variable``, ``kind`` (class / value), ``site``, ``layer``, ``position``,
    ``score`` (accuracy or R^2), ``control`` (same probe, shuffled labels), ``selectivity``,
    ``chance`` (majority-class share, 0 for values), ``decodable``, ``n_train``, ``n_test``.
    ``summary``: ``threshold``, ``min_selectivity``. Per variable: :meth:`first_layer`,
    :meth:`best_score`, :meth:`best_selectivity`.
    """

    kind = "probes"

    def first_layer(self, variable: str, last: bool = False) -> int | None:
        """Smallest residual depth at which some position decodes ``variable`` (None if none);
        ``last=True``: at the last position only."""
        part = self._rows(variable)
        hits = part[(part.site == "resid") & part.decodable]
        if last:
            hits = hits[hits.position.isin([self.meta.get("n_positions", 0) - 1, "last"])]
        return int(hits.layer.min()) if len(hits) else None

    def best_score(self, variable: str) -> float:
        """The highest probe score of ``variable`` over every site, layer and position."""
        return float(self._rows(variable).score.max())

    def best_selectivity(self, variable: str) -> float:
        """The highest selectivity of ``variable`` over every site, layer and position."""
        return float(self._rows(variable).selectivity.max())

    def _rows(self, variable: str) -> pd.DataFrame:
        part = self.df[self.df.variable == variable]
        if part.empty:
            raise InputError(
                f"no probes of variable {variable!r}",
                fix=f"use one of {sorted(set(self.df.variable))}",
            )
        return part

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
        """One heatmap (depths x positions) per variable, plus the first-decodable-depth map
        (its own colour scale; blank where nothing decodes)."""
        variables = list(dict.fromkeys(self.df.variable))
        titles = [f"{v}: {self._first_text(v)}" for v in variables] + [
            figure_words("probes", "first_panel")
        ]
        cols = min(3, len(variables) + 1)
        rows = -(-(len(variables) + 1) // cols)
        fig = make_subplots(
            rows=rows,
            cols=cols,
            subplot_titles=titles,
            horizontal_spacing=0.08,
            vertical_spacing=0.22 / rows + 0.08,
        )
        depths = sorted(set(self.df.layer))
        for i, v in enumerate(variables):
            table = self.map(v, value, site)
            fig.add_trace(
                go.Heatmap(
                    z=table.to_numpy(),
                    x=[str(c) for c in table.columns],
                    y=[int(r) for r in table.index],
                    zmin=0,
                    zmax=1,
                    colorscale=figures.SEQUENTIAL,
                    showscale=i == 0,
                    colorbar={
                        "title": {"text": figures.wrap(figures.words(value), 12)},
                        "x": 1.02,
                        "y": 1.0,
                        "yanchor": "top",
                        "len": 0.45,
                    },
                    hovertemplate=f"{v}<br>position %{{x}}<br>depth %{{y}}<br>{value} %{{z:.3f}}"
                    "<extra></extra>",
                ),
                row=i // cols + 1,
                col=i % cols + 1,
            )
            figures.integer_axis(fig, "y", n=len(depths), row=i // cols + 1, col=i % cols + 1)
        self._first_panel(fig, site, len(variables) // cols + 1, len(variables) % cols + 1)
        fig.update_xaxes(title_text=AXES["position"])
        fig.update_yaxes(title_text=figure_words("probes", "y"), col=1)
        figures.base_layout(
            fig,
            figure_words(
                "probes",
                site=site,
                value=figures.words(value),
                threshold=self.summary.get("threshold"),
                min_selectivity=self.summary.get("min_selectivity"),
            ),
            width=360 * cols + 160,
            height=300 * rows + 80,
        )
        return fig

    def _first_text(self, variable: str) -> str:
        first = self.first_layer(variable)
        if first is None:
            return figure_words("probes", "not_decodable")
        return figure_words("probes", "decodable_from", depth=first)

    def _first_panel(self, fig: go.Figure, site: str, row: int, col: int) -> None:
        """Variables x positions map of the first decodable depth, with its own colour bar."""
        first = self.first_layers(site)
        z = first.to_numpy(dtype=float)
        deepest = max(1, int(self.df.layer.max()))
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[str(c) for c in first.columns],
                y=list(first.index),
                zmin=0,
                zmax=deepest,
                colorscale="Cividis_r",
                colorbar={
                    "title": {"text": figure_words("probes", "first_colorbar")},
                    "x": 1.02,
                    "y": 0.0,
                    "yanchor": "bottom",
                    "len": 0.45,
                    "tickmode": "linear",
                    "tick0": 0,
                    "dtick": max(1, -(-deepest // 6)),
                },
                text=[["" if np.isnan(d) else str(int(d)) for d in line] for line in z],
                texttemplate="%{text}",
                hovertemplate="%{y} at position %{x}: first decodable at depth %{z}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        fig.update_yaxes(title_text=figure_words("probes", "y_first"), row=row, col=col)


# ---------------------------------------------------------------- labels
def _labels(
    task: TaskData | None, labels: Any, kinds: Mapping[str, str] | None, n: int
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    if labels is None:
        if task is None:
            raise InputError(
                "no labels to probe for",
                fix="pass labels={'name': one value per sequence}, or task data (TaskData)",
            )
        out = {str(k): np.asarray(v) for k, v in task.variables().items()}
    elif isinstance(labels, Mapping):
        out = {str(k): np.asarray(v) for k, v in labels.items()}
    else:
        out = {"label": np.asarray(labels)}
    if not out:
        raise InputError("labels is empty", fix="pass at least one variable")
    kinds = dict(kinds or {})
    result_kinds = {name: _kind(name, values, kinds, n) for name, values in out.items()}
    unknown = set(kinds) - set(out)
    if unknown:
        raise InputError(
            f"kinds given for unknown variables {sorted(unknown)}",
            fix=f"use names among {sorted(out)}",
        )
    return out, result_kinds


def _kind(name: str, values: np.ndarray, kinds: Mapping[str, str], n: int) -> str:
    if values.ndim != 1 or len(values) != n:
        raise InputError(
            f"labels {name!r} have shape {values.shape} for {n} sequences",
            fix="give one label per sequence (a 1-D array of length n)",
        )
    kind = kinds.get(name, "value" if values.dtype.kind == "f" else "class")
    if kind not in KINDS:
        raise InputError(f"unknown kind {kind!r} of {name!r}", fix=f"use one of {KINDS}")
    if kind == "value" and not np.isfinite(values.astype(float)).all():
        raise InputError(f"labels {name!r} hold NaN or inf", fix="pass finite values")
    return kind


def _check_varies(name: str, values: np.ndarray, kind: str) -> None:
    """Refuse a variable with a single class (or a single value): every probe, and the control
    on shuffled labels, would score 1.0 and nothing would be learned."""
    distinct = np.unique(values)
    if len(distinct) < 2:
        what = "class" if kind == "class" else "value"
        raise InputError(
            f"labels {name!r} have a single {what} ({distinct.tolist()[0]!r} for all "
            f"{len(values)} sequences), so there is nothing for a probe to decode",
            fix=f"pass labels with at least two different {what}s, or leave {name!r} out",
        )


# ---------------------------------------------------------------- sites
def _site_hooks(model: Model, sites: Sequence[str]) -> list[tuple[str, int, str]]:
    """(site, layer, hook) of every probe site: ``resid`` at depths 0..L (see
    :data:`PROBE_SITES`)."""
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


@torch.no_grad()
def linear_probes(
    model: Model,
    data: DataOrTask,
    *,
    labels: Any = None,
    kinds: Mapping[str, str] | None = None,
    sites: Sequence[str] = PROBE_SITES,
    positions: str | Sequence[int | str] = "all",
    probe: str = "logistic",
    test_size: float = 0.25,
    threshold: float = 0.8,
    min_selectivity: float = 0.2,
    max_iter: int = 200,
    batch_size: int | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> ProbeResult:
    """Train linear probes for each variable at every site, layer and position.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: task data (:class:`~probekit.data.TaskData`, or a list of them) or any token data.
        labels: ``{name: one label per sequence}`` (or one array, named 'label'); default for
            task data: its ``variables()`` (the anchor task: key, a1, a2, g1, target).
        kinds: ``{name: 'class' | 'value'}``; default 'value' for float labels, else 'class'.
        sites: any of 'resid', 'attn_out', 'mlp_out' (see :data:`PROBE_SITES`).
        positions: 'all' (every index), 'last' (the last real token), a role name of the task
            data that marks one position per sequence, 'roles' (every such role, then 'last'),
            or a list of position indices (negative from the end) and such names.
        probe: 'logistic' (default) or 'ridge' (RidgeClassifier, much faster for many classes)
            for class variables; value variables always use ridge regression.
        test_size: held-out share of the sequences.
        threshold: the score (accuracy, or R² for value variables) a probe needs to count
            as decodable.
        min_selectivity: the selectivity (its score minus that of a probe on shuffled labels)
            it needs too.
        batch_size: sequences per forward (None: the automatic, memory-bounded choice).
        seed: seeds the train/test split and the control permutation; ``progress`` is called
            with a short text before each site and layer.

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> tokens = toy_tokens(batch=40, length=4)
        >>> res = linear_probes(toy_model("gpt2", n_layers=1), tokens,
        ...                     labels={"parity": tokens[:, 0] % 2}, positions=[0], probe="ridge")
        >>> sorted(set(res.df.layer)), res.first_layer("parity") in (None, 0, 1)
        ([0, 1], True)
    """
    # 73 lines long: 17 are the signature and 28 the docstring documenting every parameter.
    model = load(model)
    task, batches = batches_of(model, data, batch_size)
    check_one_length(batches, "linear_probes (it stacks positions over the sequences)")
    n = sum(len(b.tokens) for b in batches)
    variables, var_kinds = _labels(task, labels, kinds, n)
    n_test = _check_settings(sites, probe, test_size, n)
    n_pos = batches[0].tokens.shape[1]
    pos_list = _positions(positions, n_pos, task)
    for name, values in variables.items():
        _check_varies(name, values, var_kinds[name])
    all_valid = np.concatenate([b.valid.cpu().numpy() for b in batches])
    index = {pos: row_positions(pos, task, all_valid) for pos in pos_list}
    split = _Split.draw(n, n_test, variables, seed)
    fit = _Fit(var_kinds, probe, max_iter)
    rows = []
    for site, layer, hook in counted(_site_hooks(model, sites), "layers"):
        if progress is not None:
            progress(f"{site} layer {layer}")
        acts, valid = gather(model, batches, hook)  # one site at a time
        with one_blas_thread():  # many small fits: see numerics.one_blas_thread
            for pos, idx in index.items():
                rows += _probe_position(acts, valid, idx, split, variables, fit, (site, layer, pos))
        del acts  # before the next site is gathered
    df = pd.DataFrame(rows)
    df["decodable"] = (df.score >= threshold) & (df.selectivity >= min_selectivity)
    summary = {"threshold": threshold, "min_selectivity": min_selectivity}
    meta = result_meta(model, positions=pos_list, batch_size=batch_size, sites=list(sites))
    meta.update(n_positions=n_pos, probe=probe, kinds=var_kinds, test_size=test_size, seed=seed)
    return ProbeResult(df, summary, meta)


def _check_settings(sites: Sequence[str], probe: str, test_size: float, n: int) -> int:
    """Check the settings; the number of test sequences."""
    unknown = set(sites) - set(PROBE_SITES)
    if unknown or not sites:
        raise InputError(f"unknown probe sites {sorted(unknown)}", fix=f"use any of {PROBE_SITES}")
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
    return n_test


@dataclass
class _Split:
    """The seeded train/test split of the sequences and the control task's shuffled labels."""

    train: np.ndarray
    test: np.ndarray
    shuffled: dict[str, np.ndarray]

    @classmethod
    def draw(cls, n: int, n_test: int, variables: Mapping[str, np.ndarray], seed: int) -> _Split:
        rng = np.random.default_rng(seed)
        order = rng.permutation(n)
        test_idx, train_idx = order[:n_test], order[n_test:]
        shuffled = {name: rng.permutation(v[train_idx]) for name, v in variables.items()}
        return cls(train_idx, test_idx, shuffled)


@dataclass
class _Fit:
    kinds: dict[str, str]
    probe: str
    max_iter: int

    def __call__(
        self,
        name: str,
        x_train: np.ndarray,
        y_train: np.ndarray,
        x_test: np.ndarray,
        y_test: np.ndarray,
    ) -> float:
        return fit_probe(
            x_train, y_train, x_test, y_test, self.kinds[name], self.probe, self.max_iter
        )


def _probe_position(
    acts: np.ndarray,
    valid: np.ndarray,
    idx: np.ndarray,
    split: _Split,
    variables: Mapping[str, np.ndarray],
    fit: _Fit,
    where: tuple[str, int, int | str],
) -> list[dict[str, Any]]:
    """One row per variable: probe and control at one (site, layer, position)."""
    site, layer, pos = where
    ok = valid[np.arange(len(valid)), idx]
    keep_tr = ok[split.train]
    tr, te = split.train[keep_tr], split.test[ok[split.test]]
    if len(tr) < 2 or len(te) < 1:
        return []
    x_tr, x_te = acts[tr, idx[tr]], acts[te, idx[te]]
    rows = []
    for name, values in variables.items():
        kind = fit.kinds[name]
        y_tr, y_te = values[tr], values[te]
        score = fit(name, x_tr, y_tr, x_te, y_te)
        control = fit(name, x_tr, split.shuffled[name][keep_tr], x_te, y_te)
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
    return rows


def _positions(positions: str | Sequence[int | str], n_pos: int, task: TaskData | None) -> list:
    if positions == "all":
        return list(range(n_pos))
    if positions == "roles":
        if task is None:
            raise InputError(
                "positions='roles' needs task data",
                fix="pass task data (e.g. task.dataset(split)), or positions='all' / 'last' / "
                "a list",
            )
        return [*single_roles(task), "last"]
    return position_list(positions, n_pos)


__all__ = ["KINDS", "PROBE_SITES", "ProbeResult", "fit_probe", "linear_probes"]

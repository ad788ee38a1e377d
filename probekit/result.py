"""The shape every analyzer returns: a tidy table, headline numbers, a figure, save/load.

Each analyzer is a function ``(model, data, ...) -> SomeResult`` where ``SomeResult`` subclasses
:class:`Result`. ``.df`` is a tidy pandas DataFrame (one row per measured quantity), ``.summary``
a flat dict of headline numbers, ``.meta`` the settings that produced it, and ``.figure()`` a
plotly figure built from ``.df`` alone, so a loaded result draws the same figure.

Example:
    >>> import pandas as pd
    >>> r = Result(pd.DataFrame({"layer": [0, 1], "value": [0.5, 0.25]}), {"total": 0.75})
    >>> r.summary["total"]
    0.75
"""

from __future__ import annotations

import functools
import html
import importlib
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any, ClassVar
from zipfile import BadZipFile

import numpy as np
import pandas as pd

from probekit.errors import CheckpointError, InputError
from probekit.io import atomic_write_bytes, atomic_write_text, read_regular_file
from probekit.words import VALUE_WORDS
from probekit.words import label as key_label

SIDECAR_CELLS = 20_000
"""A table with more cells than this keeps its numeric columns in a ``.npz`` beside the JSON."""

_INF = {"inf": math.inf, "-inf": -math.inf}

_REGISTRY: dict[str, type[Result]] = {}

RESULT_MODULES: dict[str, str] = {
    "contributions": "probekit.analyses.depth.contributions",
    "residual": "probekit.analyses.depth.residual",
    "skip_effects": "probekit.analyses.depth.skips",
    "gradients": "probekit.analyses.depth.gradients",
    "swaps": "probekit.analyses.depth.swaps",
    "layer_similarity": "probekit.analyses.depth.similarity",
    "logit_lens": "probekit.analyses.depth.lens",
    "tuned_lens": "probekit.analyses.depth.tuned_lens",
    "token_lens": "probekit.analyses.depth.token_lens",
    "model_loss": "probekit.analyses.depth.loss",
    "attention_knockout": "probekit.analyses.mechanisms.knockout",
    "token_masking": "probekit.analyses.mechanisms.masking",
    "information_flow": "probekit.analyses.mechanisms.flow",
    "hidden_state_map": "probekit.analyses.mechanisms.maps",
    "pair_cosines": "probekit.analyses.mechanisms.maps",
    "probes": "probekit.analyses.mechanisms.probes",
    "solutions": "probekit.analyses.mechanisms.solutions",
    "condensation": "probekit.analyses.weights.condensation",
    "condensation_timeline": "probekit.analyses.weights.condensation",
    "checkpoint_weights": "probekit.analyses.weights.condensation",
    "embedding_map": "probekit.analyses.weights.embeddings",
    "spectra": "probekit.analyses.weights.spectra",
    "timeline": "probekit.analyses.across_checkpoints",
    "depth_headlines": "probekit.analyses.across_checkpoints",
    "depth_timeline": "probekit.analyses.across_checkpoints",
    "family": "probekit.training.families",
    "sweep": "probekit.anchor.sweep",
    "diagnoses": "probekit.cluster",
    # --- activation patching and direct logit attribution ---
    "activation_patching": "probekit.analyses.mechanisms.patching",
    "direct_logit_attribution": "probekit.analyses.mechanisms.patching",
    # --- depth-against-width study results ---
    "depth_width_study": "probekit.studies.results",
    "transition_study": "probekit.studies.results",
    # --- anchor runs: per-pair convergence curves ---
    "pair_curves": "probekit.anchor.curves",
}
"""Every kind of result probekit writes -> the module that defines its class. :meth:`Result.load`
imports that module when the kind is not registered yet, so a file loads in a fresh process
(the classes register themselves on import; ``tests/test_result_kinds.py`` checks this map
against every Result subclass in probekit)."""


def json_ready(value: Any) -> Any:
    """Turn numpy / torch scalars and containers into JSON-ready Python values."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else value
    return value


class Result:
    """Base class of analyzer results (tidy ``df``, ``summary`` dict, ``figure()``, save/load)."""

    kind: ClassVar[str] = "result"

    def __init__(
        self, df: pd.DataFrame, summary: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> None:
        self.df = df
        self.summary = dict(summary)
        self.meta = dict(meta or {})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _REGISTRY[cls.kind] = cls
        own = cls.__dict__.get("figure")
        if own is not None and not hasattr(own, "__wrapped__"):
            cls.figure = _naming_what_is_missing(own)  # type: ignore[method-assign]  # on purpose

    def figure(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - subclasses draw
        """Return a plotly figure of this result (the options, if any, depend on the kind)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        head = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in list(self.summary.items())[:6]
        )
        return f"{type(self).__name__}({head}; df: {len(self.df)} rows)"

    def _repr_html_(self) -> str:
        """Jupyter's view: the headline numbers as a small table (the figure: ``.figure()``)."""
        return (
            f"<div><strong>{html.escape(type(self).__name__)}</strong> "
            f"<span style='color:#666'>({len(self.df)} rows in <code>.df</code>; draw it with "
            f"<code>.figure()</code>)</span>{summary_table(self.summary, kind=self.kind)}</div>"
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write the result to one JSON file, atomically; :meth:`load` reads it back exactly.

        Floats are written with ``repr`` precision, so a loaded ``df`` equals the saved one. A
        large table (over :data:`SIDECAR_CELLS` cells) keeps its numeric columns in a compressed
        ``.npz`` of the same name beside the JSON (exact binary), written first.
        """
        path = Path(path)
        try:
            return self._write(path)
        except OSError as err:
            raise InputError(
                f"cannot write the result to {path}: {err.strerror or err} (read-only folder, "
                "no permission, a file in the way or a full disk)",
                fix="save into a folder you can write to",
            ) from err

    def _write(self, path: Path) -> Path:
        """:meth:`save`'s writing: the ``.npz`` first when there is one, then the JSON."""
        df = self.df.reset_index(drop=True)
        binary = _numeric_columns(df) if df.size > SIDECAR_CELLS else []
        table: dict[str, Any] = {
            "columns": [str(c) for c in df.columns],
            "dtypes": {str(c): str(df[c].dtype) for c in df.columns},
            "data": {str(c): _column_values(df[c]) for c in df.columns if c not in binary},
        }
        if binary:
            buffer = io.BytesIO()
            np.savez_compressed(buffer, **{str(c): df[c].to_numpy() for c in binary})
            atomic_write_bytes(path.with_suffix(".npz"), buffer.getvalue())
            table["npz"] = path.with_suffix(".npz").name
        payload = {
            "kind": self.kind,
            "summary": json_ready(self.summary),
            "meta": json_ready(self.meta),
            "df": table,
        }
        return atomic_write_text(path, json.dumps(payload, indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Result:
        """Read a result saved by :meth:`save`, returning an instance of the saved class."""
        path = Path(path)
        raw = read_regular_file(path, RESULT_FILE_BYTES, "a probekit result file")
        try:
            payload = _checked_payload(json.loads(raw))
            kind = payload["kind"]
            df = _read_table(payload["df"], path)
        except (OSError, ValueError, KeyError, TypeError, RecursionError, BadZipFile) as err:
            raise CheckpointError(
                f"cannot read a probekit result from {path} ({str(err)[:300]})",
                fix="pass a file written by Result.save()",
            ) from err
        klass = result_class(kind, path)
        result = klass.__new__(klass)
        Result.__init__(result, df.reset_index(drop=True), payload["summary"], payload["meta"])
        return result


_REGISTRY[Result.kind] = Result


def result_class(kind: Any, path: str | os.PathLike = "the file") -> type[Result]:
    """The Result class of a saved ``kind``, importing the module that defines it if needed.

    Example:
        >>> result_class("contributions").__name__
        'ContributionResult'
    """
    if not isinstance(kind, str):
        raise CheckpointError(
            f"{path} names its result kind as a JSON {type(kind).__name__} ({kind!r:.60}), "
            "not a string",
            fix="pass a file written by Result.save()",
        )
    if kind not in _REGISTRY and kind in RESULT_MODULES:
        importlib.import_module(RESULT_MODULES[kind])
    klass = _REGISTRY.get(kind)
    if klass is None:
        known = ", ".join(sorted({*RESULT_MODULES, *_REGISTRY}))
        raise CheckpointError(
            f"{path} holds a result of unknown kind {kind!r:.60}; probekit writes these kinds: "
            f"{known}",
            fix="pass a file written by Result.save() of this probekit version, or import the "
            "module that defines your own Result subclass before loading",
        )
    return klass


def registered_results() -> dict[str, type[Result]]:
    """Every Result class registered so far, by kind: :class:`Result` itself and the classes
    of the modules imported until now (a Result subclass registers itself when its module is
    imported; :func:`result_class` imports the one of a kind in :data:`RESULT_MODULES`).

    Example:
        >>> import probekit.analyses.depth.contributions
        >>> registered_results()["contributions"].__name__
        'ContributionResult'
    """
    return dict(_REGISTRY)


RESULT_FILE_BYTES = 1 << 30
"""The largest result JSON (or its .npz) :meth:`Result.load` reads: far above what probekit
writes, and a bound that a device file or a runaway file cannot pass."""


def _checked_payload(payload: Any) -> dict[str, Any]:
    """The saved object, checked against the shape :meth:`Result.save` writes: ``summary`` and
    ``meta`` objects, a ``df`` whose ``columns`` list names each column's ``dtypes`` string
    and, for columns kept in the JSON, a list of ``data`` values of one common length."""
    if not isinstance(payload, dict):
        raise ValueError(f"the file holds a JSON {type(payload).__name__}, not an object")
    for key in ("kind", "summary", "meta", "df"):
        if key not in payload:
            raise ValueError(f"it has no {key!r} entry")
    for key in ("summary", "meta", "df"):
        if not isinstance(payload[key], dict):
            raise ValueError(f"its {key!r} is a {type(payload[key]).__name__}, not an object")
    for key in ("summary", "meta"):
        _check_counts(payload[key], key)
    _check_numbers(payload["summary"])
    table = payload["df"]
    if "schema" in table:  # the older pandas table JSON, read by pandas
        return payload
    columns, dtypes, data = table.get("columns"), table.get("dtypes"), table.get("data")
    if not isinstance(columns, list) or not isinstance(dtypes, dict) or not isinstance(data, dict):
        raise ValueError("its 'df' lacks the columns list, dtypes object or data object")
    lengths = set()
    for name in columns:
        if not isinstance(dtypes.get(name), str):
            raise ValueError(f"column {name!r} has no dtype string")
        if name in data:
            if not isinstance(data[name], list):
                raise ValueError(f"column {name!r} is not a list of values")
            lengths.add(len(data[name]))
        elif "npz" not in table:
            raise ValueError(f"column {name!r} has no values")
    if len(lengths) > 1:
        raise ValueError(f"its columns have different lengths {sorted(lengths)} (a cut file?)")
    return payload


COUNT_LIMIT = 2**53
"""The largest count (a top-level ``n_*`` entry of a summary or meta) a result file may hold;
the model's own sizes (:data:`SIZE_KEYS`) stay below :data:`SIZE_LIMIT`."""
SIZE_KEYS = ("n_layers", "n_heads", "n_blocks", "n_positions")
SIZE_LIMIT = 10**6


def _check_counts(entries: dict[str, Any], where: str) -> None:
    """The counts of a summary or meta (its top-level ``n_*`` entries: ``n_layers``,
    ``n_prompts``, ...) are None or whole numbers in range; a hand-edited ``1e999`` (read as
    infinity) or ``10**30`` layers would otherwise reach ``int()`` or ``range()`` in a figure."""
    for key, value in entries.items():
        if not key.startswith("n_") or value is None:
            continue
        limit = SIZE_LIMIT if key in SIZE_KEYS else COUNT_LIMIT
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise ValueError(
                f"its {where} entry {key!r} is {value!r:.40}, not a count in [0, {limit}]"
            )


NUMBER_KEYS = frozenset(
    {
        "clean_loss", "chance_loss", "loss", "perplexity", "second_half_share", "depth_score",
        "max_downstream_effect", "tolerance", "max_adjacent_swap_delta",
        "mean_adjacent_swap_delta", "min_boundary_confidence", "kl_threshold",
        "mean_kl_second_half", "k", "threshold", "min_selectivity", "mean_score",
        "neighbour_ratio", "order_corr", "second_half_over_first_half", "most_important_layer",
        "least_important_layer", "formed_at_depth", "top1_formed_at_depth", "top1_agreement",
        "seen_test_accuracy", "emb_cov_top_share", "kl_final_first", "skippable_threshold",
        "block_threshold", "mean_adjacent",
    }
)  # fmt: skip
"""Summary entries probekit writes as numbers (or null for NaN), besides those named by
:data:`NUMBER_PREFIXES` and :data:`NUMBER_SUFFIXES` and the counts (``n_*``)."""
NUMBER_PREFIXES = ("second_half_share_", "depth_score_", "cos_")
NUMBER_SUFFIXES = ("_first_half", "_second_half")


def _check_numbers(summary: dict[str, Any]) -> None:
    """The summary entries probekit writes as numbers (:data:`NUMBER_KEYS`) are numbers or
    null: a hand-edited ``"clean_loss": "abc"`` would otherwise load silently and fail, or
    print, later (issue 31)."""
    for key, value in summary.items():
        numeric = (
            key in NUMBER_KEYS or key.startswith(NUMBER_PREFIXES) or key.endswith(NUMBER_SUFFIXES)
        )
        if not numeric or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(
                f"its summary entry {key!r} is a JSON {type(value).__name__} ({value!r:.40}), "
                "not a number"
            )


def _naming_what_is_missing(figure: Any) -> Any:
    """``figure`` that turns a missing column or summary entry, or a number out of range, of
    a (hand-edited) result into one :class:`CheckpointError` naming it, instead of pandas'
    ``KeyError`` or ``int()``'s ``OverflowError``."""

    @functools.wraps(figure)
    def checked(self: Result, *args: Any, **kwargs: Any) -> Any:
        try:
            return figure(self, *args, **kwargs)
        except (KeyError, AttributeError, OverflowError) as err:
            missing = _missing_entry(err, self)
            if missing is None:
                raise
            raise CheckpointError(
                f"this {self.kind} result cannot be drawn: {missing} (its table's columns: "
                f"{[str(c) for c in self.df.columns][:12]})",
                fix="draw a result as Result.save() wrote it (an edited file loses what its "
                "figure reads), or compute it again",
            ) from err

    return checked


def _missing_entry(err: Exception, result: Result) -> str | None:
    """What ``err`` (raised inside ``result.figure()``) says the result lacks, in words; None
    when it is not about the result's own table, summary or numbers."""
    columns = {str(c) for c in result.df.columns}
    if isinstance(err, OverflowError):
        return f"it holds a number out of range ({err})"
    if isinstance(err, AttributeError):
        name = getattr(err, "name", None)
        owner = getattr(err, "obj", None)
        if isinstance(owner, pd.DataFrame) and name and name not in columns:
            return f"its table has no column {name!r}"
        return None
    key = err.args[0] if err.args else None
    if isinstance(key, str) and key in result.summary:
        return None
    if (
        isinstance(key, str)
        and key not in columns
        and (key.isidentifier() or "not columns" in key or "not in index" in key)
    ):
        listed = re.search(r"\[(.*)\]", key)  # pandas: "... not columns ...: ['value']"
        named = re.findall(r"'([^']+)'", listed.group(1) if listed else key) or [key]
        absent = [n for n in named if n not in columns] or named
        return f"it has no column or summary entry {absent[0]!r}"
    return None


def _numeric_columns(df: pd.DataFrame) -> list[Any]:
    """The columns of ``df`` a ``.npz`` holds exactly: plain numpy numbers and booleans."""
    return [
        c
        for c in df.columns
        if isinstance(df[c].dtype, np.dtype)
        and df[c].dtype.kind in "biuf"
        and str(c).isidentifier()
    ]


def _column_values(column: pd.Series) -> list[Any]:
    """A column as JSON values: floats at full precision, NaN as null, infinities as strings."""
    values = []
    for value in column.tolist():
        if isinstance(value, float) and math.isinf(value):
            values.append("inf" if value > 0 else "-inf")
        else:
            values.append(json_ready(value))
    return values


def _read_table(table: dict[str, Any], path: Path) -> pd.DataFrame:
    """The DataFrame of a saved ``df`` entry (this format, or the older pandas table JSON)."""
    if "schema" in table:  # written by probekit before the exact format (10 decimals)
        return pd.read_json(io.StringIO(json.dumps(table)), orient="table")
    columns: dict[str, Any] = {}
    arrays = {}
    if "npz" in table:
        if not isinstance(table["npz"], str) or Path(table["npz"]).name != table["npz"]:
            raise ValueError(f"its npz entry {table['npz']!r} is not a file name beside it")
        binary = read_regular_file(path.parent / table["npz"], RESULT_FILE_BYTES, "an .npz")
        with np.load(io.BytesIO(binary), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        lengths = {len(a) for a in arrays.values()} | {len(v) for v in table["data"].values()}
        if len(lengths) > 1:
            raise ValueError(f"the JSON and its .npz hold columns of lengths {sorted(lengths)}")
    for name in table["columns"]:
        dtype = table["dtypes"][name]
        if name in arrays:
            columns[name] = pd.Series(arrays[name], dtype=dtype)
            continue
        values = table["data"][name]
        if dtype.startswith("float"):
            values = [_INF.get(v, v) if isinstance(v, str) else v for v in values]
            values = [math.nan if v is None else v for v in values]
        columns[name] = pd.Series(values, dtype=object).astype(dtype)
    return pd.DataFrame(columns, columns=table["columns"])


def readable(key: str, kind: str | None = None) -> str:
    """A summary key in words (:func:`probekit.words.label`): ``second_half_share`` -> ``share
    of the output change ...``.

    Example:
        >>> readable("seen_test_accuracy")
        'accuracy on seen pairs (test inputs)'
    """
    return key_label(key, kind)


def readable_value(value: Any) -> str:
    """A summary value for a reader: 4 significant digits, lists joined, a missing number as
    ``n/a`` with the reason.

    Example:
        >>> readable_value(0.04096981166747418), readable_value(float("nan"))
        ('0.04097', 'n/a (not reached or not defined for this model and data)')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a (not reached or not defined for this model and data)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(readable_value(v) for v in value) or "none"
    if isinstance(value, dict):
        return "; ".join(f"{readable(str(k))}: {readable_value(v)}" for k, v in value.items())
    return str(json_ready(value))


def layer_ranges(blocks: Any) -> str:
    """Half-open layer ranges ``[[start, stop], ...]`` as people write them.

    Example:
        >>> layer_ranges([[0, 6], [6, 7]]), layer_ranges([])
        ('layers 0–5; layer 6', 'none')
    """
    words = [
        f"layer {a}" if b - a == 1 else f"layers {a}–{b - 1}"
        for a, b in (pair for pair in blocks if isinstance(pair, list | tuple) and len(pair) == 2)
    ]
    return "; ".join(words) or "none"


_VALUE_WORDS = {
    "blocks": layer_ranges,
    "permutable_blocks": layer_ranges,
    "similar_blocks": layer_ranges,
    "near_identity_layers": layer_ranges,
    "swap_blocks": layer_ranges,
}
"""Summary keys whose values read better in their own words than as a flat list."""


def shown_rows(summary: dict[str, Any], kind: str | None = None) -> list[tuple[str, str]]:
    """``(label, value)`` per summary key, in words (the rows of :func:`summary_table`); a
    ``<key>_<measure>`` that repeats ``<key>`` for the summary's own ``measure`` is shown once.

    Example:
        >>> shown_rows({"clean_loss": 2.0})
        [('loss of the unmodified model (nats)', '2')]
    """
    measure = summary.get("measure")
    rows = []
    for key, value in summary.items():
        base = str(key).removesuffix(f"_{measure}") if measure else str(key)
        if base != key and base in summary and summary[base] == value:
            continue
        own = _VALUE_WORDS.get(key) if isinstance(value, list) else None
        if isinstance(value, str) and key in VALUE_WORDS:
            shown = VALUE_WORDS[key](value)
        else:
            shown = own(value) if own else readable_value(value)
        rows.append((readable(str(key), kind), shown))
    return rows


def summary_table(summary: dict[str, Any], limit: int = 40, kind: str | None = None) -> str:
    """The headline numbers as an HTML table in words; past ``limit`` rows the rest is folded
    into a ``<details>`` element.

    Example:
        >>> "loss of the unmodified model" in summary_table({"clean_loss": 2.0})
        True
    """
    rows = [
        f"<tr><th>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
        for label, value in shown_rows(json_ready(summary), kind)
    ]
    head, rest = rows[:limit], rows[limit:]
    more = (
        f"<details><summary>{len(rest)} more</summary><table>{''.join(rest)}</table></details>"
        if rest
        else ""
    )
    return f"<table>{''.join(head)}</table>{more}"

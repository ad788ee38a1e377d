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

import io
import json
import math
import os
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from probekit.errors import CheckpointError
from probekit.io import atomic_write_text

_REGISTRY: dict[str, type[Result]] = {}


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

    def figure(self):  # pragma: no cover - every subclass draws its own
        """Return a plotly figure of this result."""
        raise NotImplementedError

    def __repr__(self) -> str:
        head = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in list(self.summary.items())[:6]
        )
        return f"{type(self).__name__}({head}; df: {len(self.df)} rows)"

    def save(self, path: str | os.PathLike) -> Path:
        """Write the result to one JSON file, atomically; :meth:`load` reads it back."""
        payload = {
            "kind": self.kind,
            "summary": json_ready(self.summary),
            "meta": json_ready(self.meta),
            "df": json.loads(self.df.to_json(orient="table", index=False)),
        }
        return atomic_write_text(path, json.dumps(payload, indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Result:
        """Read a result saved by :meth:`save`, returning an instance of the saved class."""
        path = Path(path)
        try:
            payload = json.loads(path.read_text())
            if not isinstance(payload, dict):
                raise ValueError(f"the file holds a JSON {type(payload).__name__}, not an object")
            kind = payload["kind"]
            df = pd.read_json(io.StringIO(json.dumps(payload["df"])), orient="table")
        except (OSError, ValueError, KeyError) as err:
            raise CheckpointError(
                f"cannot read a probekit result from {path} ({err})",
                fix="pass a file written by Result.save()",
            ) from err
        klass = _REGISTRY.get(kind)
        if klass is None:
            raise CheckpointError(
                f"{path} holds a result of unknown kind {kind!r}",
                fix="import the module that defines it, or upgrade probekit",
            )
        result = klass.__new__(klass)
        Result.__init__(result, df.reset_index(drop=True), payload["summary"], payload["meta"])
        return result

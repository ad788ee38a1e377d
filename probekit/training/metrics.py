"""A run's ``metrics.jsonl``: one JSON row per evaluation, written whole and atomically, read
back up to the step a resumed run starts from.

Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "metrics.jsonl"
    >>> write_metrics(path, [{"step": 1, "loss": float("nan")}, {"step": 2, "loss": 0.5}])
    >>> read_metrics(path, up_to_step=1)
    [{'step': 1, 'loss': None}]
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from probekit.errors import CheckpointError
from probekit.io import atomic_write_text


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_metrics(path: Path, rows: list[dict[str, Any]]) -> None:
    """All of a run's metrics rows as JSON lines (non-finite numbers as null), atomically."""
    text = "".join(json.dumps({k: _jsonable(v) for k, v in r.items()}) + "\n" for r in rows)
    atomic_write_text(path, text)


def read_metrics(path: Path, up_to_step: int) -> list[dict[str, Any]]:
    """The rows of ``path`` up to ``up_to_step`` (a resumed run drops the rows after its
    checkpoint); none when there is no file."""
    if not path.exists():
        return []
    fix = "pass resume=False / --no-resume to train again, or delete the run folder"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is unreadable ({err})", fix=fix) from err
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise CheckpointError(f"{path} line {number} is not JSON ({err})", fix=fix) from err
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise CheckpointError(f"{path} line {number} has no integer step", fix=fix)
        rows.append(row)
    return [r for r in rows if r["step"] <= up_to_step]


__all__ = ["read_metrics", "write_metrics"]

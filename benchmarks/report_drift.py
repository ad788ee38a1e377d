"""How far the numbers of one diagnosis report move from another's: the headline numbers and
every analysis table, value by value.

Used to measure what computing in half precision costs in accuracy (issue 36, item 5): the
same checkpoint and the same tokens (``--random-tokens`` draws them from a fixed seed)
diagnosed in float32 and in bfloat16, then

    python benchmarks/report_drift.py REPORT_FLOAT32 REPORT_BF16

prints, per headline number, both values and their difference; per analysis table
(``<analysis>.csv``), the number of values, the largest difference relative to
``max(1, |float32 value|)`` and where it is; and whether the verdict's sentences are the
same. Values that are NaN in both count as equal; NaN in one only is reported.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd


def headline_rows(a: dict, b: dict) -> list[str]:
    """One line per numeric headline entry of the two ``summary.json`` headlines."""
    lines = []
    for key, value in a.items():
        other = b.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            same = "same" if value == other else "differs"
            lines.append(f"  {key:32s} {str(value)[:40]:>42s}   {same}")
            continue
        if not isinstance(other, int | float):
            lines.append(f"  {key:32s} {value!r:>20} {other!r:>20}   missing")
            continue
        diff = other - value
        lines.append(f"  {key:32s} {value:20.6g} {other:20.6g}   {diff:+.3g}")
    return lines


def table_drift(a: pd.DataFrame, b: pd.DataFrame) -> tuple[int, float, str, int]:
    """Values compared (row by row: one diagnosis writes its tables in one order), the
    largest difference relative to ``max(1, |reference|)``, the row where it is (its
    columns that are not numbers, and its layer), and the count of values finite in one
    table only."""
    if a.shape != b.shape or list(a.columns) != list(b.columns):
        raise SystemExit(f"the tables differ in shape: {a.shape} and {b.shape}")
    numeric = [c for c in a.select_dtypes("number").columns if "layer" not in c]
    labels = [c for c in a.columns if c not in numeric]
    worst, where, count, lone = 0.0, "", 0, 0
    for column in numeric:
        for i, (x, y) in enumerate(zip(a[column], b[column], strict=True)):
            if math.isnan(x) and math.isnan(y):
                continue
            if not (math.isfinite(x) and math.isfinite(y)):
                lone += 1
                continue
            count += 1
            rel = abs(y - x) / max(1.0, abs(x))
            if rel > worst:
                named = ", ".join(f"{k} {a[k].iloc[i]}" for k in labels)
                worst, where = rel, f"{column} ({named})"
    return count, worst, where, lone


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference", type=Path, help="the report folder to compare against")
    p.add_argument("other", type=Path, help="the report folder compared")
    args = p.parse_args(argv)
    a = json.loads((args.reference / "summary.json").read_text())
    b = json.loads((args.other / "summary.json").read_text())
    print(f"reference: {args.reference} ({a['model']})")
    print(f"other:     {args.other} ({b['model']})")
    print("headline:")
    for line in headline_rows(a["headline"], b["headline"]):
        print(line)
    print(f"verdict sentences the same: {a['verdict'] == b['verdict']}")
    print(f"{'table':20s} {'values':>8s} {'max rel. difference':>20s}  where")
    for table in sorted(args.reference.glob("*.csv")):
        other = args.other / table.name
        if not other.is_file():
            print(f"{table.stem:20s} missing in {args.other}")
            continue
        count, worst, where, lone = table_drift(pd.read_csv(table), pd.read_csv(other))
        extra = f"; {lone} finite in one only" if lone else ""
        print(f"{table.stem:20s} {count:8d} {worst:20.2e}  {where}{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Every number of a diagnosis and of five mechanism analyses on fixed toy models, as JSON.

Run it against two checkouts to check that a change kept every number (a refactoring should):

    python benchmarks/dump_numbers.py new.json
    git worktree add /tmp/old <commit>
    PYTHONPATH=/tmp/old python benchmarks/dump_numbers.py old.json
    python benchmarks/dump_numbers.py --compare old.json new.json

Only public names are used (``probekit.load``, ``probekit.AnchorTask``, the analyzers by
name, ``probekit.report.diagnose``), so the same script runs on older versions.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

import probekit
from probekit.report import diagnose
from probekit.toy import toy_hf_model, toy_tokens

MECHANISMS = (
    "solution_types",
    "attention_knockout",
    "token_masking",
    "linear_probes",
    "hidden_state_map",
)


def _values(result) -> list[float]:
    table = result.df.select_dtypes("number").to_numpy().ravel()
    return [round(float(v), 12) for v in table if not math.isnan(v)]


def dump() -> dict:
    """The numbers, keyed ``<model>/<analysis>``."""
    torch.set_num_threads(1)
    out: dict = {}
    for arch in ("gpt2", "llama"):
        model = probekit.load(toy_hf_model(arch, n_layers=3, seed=1))
        found = diagnose(model, toy_tokens(), n_bootstrap=5)
        for name, result in found.results.items():
            out[f"{arch}/{name}"] = _values(result)
        out[f"{arch}/headline"] = {
            k: v for k, v in found.headline.items() if isinstance(v, int | float)
        }
    task = probekit.AnchorTask(n_train=64, n_test=32, seed=2)
    model = probekit.load(toy_hf_model("gpt2", n_layers=2, seed=3, vocab_size=201))
    for name in MECHANISMS:
        data = task.solution_data() if name == "solution_types" else task.dataset("test_data")
        out[f"anchor/{name}"] = _values(getattr(probekit, name)(model, data))
    return out


def compare(old: dict, new: dict) -> int:
    """Print the largest difference per result; exit status 1 when any differs."""
    worst = 0.0
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            diff = max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)
        else:
            diff = 0.0 if a == b else math.inf
        worst = max(worst, diff)
        print(f"{key:32s} max |difference| {diff:.3g}")
    print(f"largest difference over {len(set(old) | set(new))} results: {worst:.3g}")
    return int(worst > 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="write the numbers to this JSON file")
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two dumps")
    args = parser.parse_args()
    if args.compare:
        old, new = (json.load(open(path)) for path in args.compare)
        return compare(old, new)
    with open(args.out, "w") as handle:
        json.dump(dump(), handle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

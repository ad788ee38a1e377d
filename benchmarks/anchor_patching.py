"""Activation patching on the two reference anchor models: patch the (3,4) run into the (4,3)
run at every site x layer x position and find what carries the composite x-10.

Trains the demo's reference models named by ``--models`` (``probekit.demo.reference_configs``:
anchor_cpu_config at gamma 0.5 'symmetric' and 0.8 'inferential', seed 0; default the
inferential one alone, 1-2 minutes on an idle 2-core machine) into ``--runs`` unless they are
there already, then, per model, takes the held-out (4,3) test sequences whose key sits at
``--key-position``, builds the same sequences with the anchors swapped to (3,4), and patches
(3,4) into (4,3) with the metric logit(x-10) - logit(x-6) (composite minus symmetric answer).
Prints the unpatched metrics, each site's grid of normalised scores (1 = the (4,3) run's value,
0 = the (3,4) run's), and writes the inferential model's figure (``--figure``) and its
direct logit attribution.

    PYTHONPATH=. python benchmarks/anchor_patching.py --figure assets/anchor_patching.png
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import probekit
from probekit.demo import reference_configs

SITES = ("resid_in", "resid_mid", "resid_out", "attn_out", "mlp_out")


def trained_runs(folder: Path, names: list[str]) -> dict[str, Path]:
    """The reference checkpoints ``names``, trained into ``folder`` if not there yet."""
    from probekit.anchor.training import train_stack

    configs = [c for c in reference_configs() if c.name in names]
    paths = {c.name: folder / "checkpoint" / c.name for c in configs}
    if not all((p / "config.json").is_file() for p in paths.values()):
        train_stack(configs, folder, progress=False)
    return paths


def swapped_runs(task, key_position: int):
    """(4,3) test sequences with the key at ``key_position``, the same with (3,4), and the
    (composite, symmetric) answers of each."""
    held = task.dataset("test_task")
    rows = held.positions == key_position
    clean = held.tokens[rows]
    corrupted = clean.clone()
    corrupted[:, key_position + 1] = clean[:, key_position + 2]
    corrupted[:, key_position + 2] = clean[:, key_position + 1]
    answers = torch.stack([held.composite[rows], held.symmetric[rows]], -1)
    return clean, corrupted, answers


def loop_patching(model, clean, corrupted, answers) -> list[float]:
    """The resid_out grid the plain way: one full forward per layer x position, a hook that
    overwrites the block output with the corrupted run's (what a loop over TransformerLens
    hooks does); the mean logit difference per cell, layer-major."""
    [c_batch], [x_batch] = model.prepare(clean), model.prepare(corrupted)
    keep: dict[int, torch.Tensor] = {}
    read = [
        (
            model.hook_name(layer, "resid_out"),
            lambda t, hook, layer=layer: keep.__setitem__(layer, t),
        )
        for layer in range(model.n_layers)
    ]
    model.forward(x_batch, read)
    rows = torch.arange(len(answers))
    out = []
    for layer in range(model.n_layers):
        for p in range(clean.shape[1]):

            def patch(t, hook, layer=layer, p=p):
                t = t.clone()
                t[:, p] = keep[layer][:, p]
                return t

            z = model.forward(c_batch, [(model.hook_name(layer, "resid_out"), patch)])[:, -1]
            out.append(float((z[rows, answers[:, 0]] - z[rows, answers[:, 1]]).mean()))
    return out


def timing(path: Path, clean, corrupted, answers, repeats: int = 3) -> None:
    """Best-of-``repeats`` seconds of the resid_out grid by probekit and by the plain loop
    (each run once before, so the one-time checks of a fresh handle are not counted), and
    their largest difference."""
    model = probekit.load(path)

    def fast():
        return list(probekit.activation_patching(model, clean, corrupted, answers=answers).df.value)

    def slow():
        with torch.no_grad():
            return loop_patching(model, clean, corrupted, answers)

    seconds = {}
    for name, way in (("probekit", fast), ("plain loop", slow)):
        way()
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            values = way()
            runs.append(time.perf_counter() - start)
        seconds[name] = (min(runs), values)
    diff = max(
        abs(a - b) for a, b in zip(seconds["probekit"][1], seconds["plain loop"][1], strict=True)
    )
    print(
        f"resid_out grid (best of {repeats}): probekit {seconds['probekit'][0]:.3f} s, "
        f"plain loop {seconds['plain loop'][0]:.3f} s (max |difference| {diff:.1e})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("/tmp/probekit-anchor-patching"))
    parser.add_argument("--key-position", type=int, default=3)
    parser.add_argument("--models", default="inferential", help="e.g. symmetric,inferential")
    parser.add_argument("--figure", type=Path, default=None)
    parser.add_argument("--timing", action="store_true", help="also time a plain loop")
    args = parser.parse_args()
    torch.set_num_threads(2)
    paths = trained_runs(args.runs, args.models.split(","))
    task = reference_configs()[0].task
    clean, corrupted, answers = swapped_runs(task, args.key_position)
    print(f"{len(clean)} held-out (4,3) sequences with the key at position {args.key_position}")
    for name, path in paths.items():
        res = probekit.activation_patching(
            path, clean, corrupted, sites=SITES, answers=answers, metric="logit_diff"
        )
        s = res.summary
        print(
            f"\n== {name}: logit(x-10) - logit(x-6): (4,3) {s['clean_metric']:.3f}, "
            f"(3,4) {s['corrupted_metric']:.3f}"
        )
        for site in SITES:
            grid = res.grid(site).round(3)
            print(f"-- {site}: normalised score (rows: layer, columns: position)")
            print(grid.to_string())
        if "0.8" in name or "inferential" in name:
            dla = probekit.direct_logit_attribution(path, clean, targets=answers)
            print("direct logit attribution of logit(x-10) - logit(x-6) at the last token:")
            print(dla.df.round(3).to_string(index=False))
            if args.timing:
                timing(path, clean, corrupted, answers)
            if args.figure is not None:
                res.figure().write_image(args.figure, width=900, height=1400)
                print(f"figure written to {args.figure}")


if __name__ == "__main__":
    main()

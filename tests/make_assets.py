"""Redraw the docs' images (assets/*.png) with the current figure code.

    probekit demo --out runs/demo --no-images        # the two anchor models (saved results)
    python -m tests.make_assets --demo runs/demo     # redraws the images below

Sources: the demo folder's saved results (``<model>/<analysis>.json``) for the anchor images,
``assets/phase-sweep-results.csv`` (the docs' sweep) for the phase diagram and
``assets/growth-comparison.json`` (benchmarks/growth_comparison.py) for the second-half share
along training. ``--growth DIR`` (a growth_comparison ``--out`` folder, with its checkpoints)
redraws the language-model contribution and swap images as well.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd  # noqa: E402

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def _write(fig, name: str, height: int | None = None) -> Path:
    path = ASSETS / name
    fig.write_image(path, width=fig.layout.width, height=height or fig.layout.height, scale=1)
    print(path)
    return path


def anchor_images(demo: Path) -> None:
    """Knockout maps of both models, condensation and embedding map of the inferential one."""
    import probekit.analyses.mechanisms.knockout  # noqa: F401  (defines the result kinds)
    import probekit.analyses.weights.condensation  # noqa: F401
    import probekit.analyses.weights.embeddings  # noqa: F401
    from probekit.result import Result

    for model in ("symmetric", "inferential"):
        knockout = Result.load(demo / model / "attention_knockout.json")
        _write(knockout.figure(), f"anchor_knockout_{model}.png")
    cond = Result.load(demo / "inferential" / "condensation.json")
    _write(cond.figure(layer=0), "anchor_condensation_inferential.png")
    emb = Result.load(demo / "inferential" / "embedding_map.json")
    _write(emb.figure(), "anchor_embedding_map_inferential.png")


def phase_diagram() -> None:
    from probekit.anchor.sweep import SweepResult

    df = pd.read_csv(ASSETS / "phase-sweep-results.csv")
    _write(SweepResult(df, {}).figure(), "phase_diagram.png")


def growth_timeline() -> None:
    from probekit.analyses.across_checkpoints import DepthTimelineResult

    records = json.loads((ASSETS / "growth-comparison.json").read_text())["timeline"]
    wide = pd.DataFrame(records)
    df = wide.melt(id_vars=["run", "step"], var_name="measure", value_name="value")
    runs = sorted(set(df.run))
    res = DepthTimelineResult(df, {"n_checkpoints": len(wide), "runs": runs})
    _write(res.figure(), "growth_second_half_share.png")


def growth_images(folder: Path) -> None:
    """Contributions and swaps of the final static and MIDAS language models."""
    import probekit
    from probekit.lm import ByteCorpus

    data = ByteCorpus().sequences("validation", 64, n=48)
    for run in ("static", "midas"):
        model = probekit.load(folder / run / "final", device="cpu")
        _write(probekit.contributions(model, data).figure(), f"lm_contributions_{run}.png")
        swaps = probekit.layer_swaps(model, data, pairs="adjacent", n_bootstrap=100)
        _write(swaps.figure(), f"lm_swaps_{run}.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, help="a `probekit demo --out` folder")
    parser.add_argument("--growth", type=Path, help="a growth_comparison.py --out folder")
    args = parser.parse_args(argv)
    phase_diagram()
    growth_timeline()
    if args.demo:
        anchor_images(args.demo)
    if args.growth:
        growth_images(args.growth)


if __name__ == "__main__":
    main()

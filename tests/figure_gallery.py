"""Every figure probekit draws, for one random anchor-sized GPT-2 model of a given depth.

tests/test_figures.py checks the figures' properties; run this module to look at them:

    python -m tests.figure_gallery --out /tmp/gallery --layers 2,12

writes one PNG per figure and depth (``<name>_L<layers>.png``, 1200 pixels wide at most).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import plotly.graph_objects as go  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import probekit  # noqa: E402
from probekit.anchor import AnchorTask  # noqa: E402
from tests.conftest import anchor_gpt2  # noqa: E402

TASK = AnchorTask(n_train=32, n_test=96, seed=0)


def anchor_model(n_layers: int, seed: int = 0) -> transformers.GPT2LMHeadModel:
    """A random GPT-2 with the anchor task's vocabulary and sequence length."""
    hf = anchor_gpt2(n_layers, seed, vocab_size=TASK.vocab_size, n_positions=TASK.seq_len)
    with torch.no_grad():  # larger weights: effects well above rounding
        for name, p in hf.named_parameters():
            if p.ndim == 2 and "wte" not in name and "wpe" not in name:
                p.mul_(2.0)
    return hf


def _sweep() -> probekit.Result:
    """A sweep table like `probekit sweep` writes (the docs' phase-diagram grid)."""
    from probekit.anchor.sweep import SweepResult

    rows = []
    for gamma in (0.3, 0.5, 0.8):
        for wd in (0.1, 1.0):
            for depth in (2, 4):
                inf = float(np.clip(gamma + 0.2 * wd - 0.1 * depth / 4, 0, 1))
                rows.append(
                    {
                        "run": f"L{depth}_g{gamma}_wd{wd}",
                        "gamma": gamma,
                        "weight_decay": wd,
                        "depth": depth,
                        "seed": 0,
                        "final_test_task_inferential": inf,
                        "final_test_task_symmetric": 1 - inf,
                        "solution": "inferential" if inf > 0.5 else "symmetric",
                    }
                )
    return SweepResult(pd.DataFrame(rows), {})


def results(n_layers: int, tmp: Path) -> dict[str, Callable[[], go.Figure]]:
    """name -> a function drawing that figure, for a random model of ``n_layers`` layers."""
    from probekit.analyses.depth.tuned_lens import compare_lenses

    out = analyses(n_layers, tmp)
    draw = {name: res.figure for name, res in out.items()}
    lenses = out["logit_lens"], out["tuned_lens"]
    draw["compare_lenses"] = lambda: compare_lenses(*lenses, names=["logit lens", "tuned lens"])
    draw["compare_timeline"] = _compare_timeline
    draw |= _study_figures()  # depth-against-width study results
    return draw


# --- depth-against-width study results ---
def _study_figures() -> dict[str, Callable[[], go.Figure]]:
    """The study results' figures, from the planted members tables of their tests."""
    from probekit.studies import depth_width_result, transition_result
    from tests.test_study_results import levine_members, petty_members

    petty = depth_width_result(
        petty_members(budgets=(1_000_000, 4_000_000), depth_effect=None), {"n_boot": 100}
    )
    levine = transition_result(levine_members(), {"n_boot": 100})
    return {
        "depth_width_study": petty.figure,
        "depth_width_equal_perplexity": lambda: petty.figure("equal_perplexity"),
        "transition_study": levine.figure,
        "transition_width_line": lambda: levine.figure("transition"),
    }


def _compare_timeline() -> go.Figure:
    """The headline numbers over a run's steps, as ``probekit timeline`` draws them."""
    from probekit.cluster import DiagnosesResult
    from probekit.compare import timeline_figure

    table = pd.DataFrame(
        {
            "name": ["step20", "step100", "step300"],
            "status": "ok",
            "second_half_share": [0.121, 0.1243, 0.131],
            "depth_score": [1.46423, 1.4712, 1.502],
        }
    )
    return timeline_figure(DiagnosesResult(table, {}, {}), [20, 100, 300])


def analyses(n_layers: int, tmp: Path) -> dict[str, probekit.Result]:
    """Every analyzer's result (and the sweep's and the depth family's) for a random model of
    ``n_layers`` layers; ``tmp`` holds the timeline's checkpoints."""
    from probekit.analyses.across_checkpoints import depth_timeline
    from probekit.analyses.depth.tuned_lens import TunedLens, tuned_lens
    from probekit.analyses.mechanisms.flow import information_flow
    from probekit.analyses.mechanisms.knockout import attention_knockout
    from probekit.analyses.mechanisms.maps import hidden_state_map, pair_cosines
    from probekit.analyses.mechanisms.masking import token_masking
    from probekit.analyses.mechanisms.probes import linear_probes
    from probekit.analyses.mechanisms.solutions import solution_types
    from probekit.analyses.weights.condensation import condensation, condensation_timeline
    from probekit.analyses.weights.embeddings import embedding_map
    from probekit.analyses.weights.spectra import spectra
    from probekit.training.families import depth_family

    hf = anchor_model(n_layers)
    model = probekit.load(hf)
    seen, held = TASK.dataset("test_data"), TASK.dataset("test_task")
    tokens = seen.tokens[:24]
    lens = tuned_lens(model, tokens, lens=TunedLens.zeros(model))
    logit = probekit.logit_lens(model, tokens)
    later = anchor_model(n_layers, seed=1)
    series = []
    for run, seed in (("static", 0), ("grown", 1)):
        for step in (10, 20):
            path = tmp / f"{run}-{step}-L{n_layers}"
            if not path.exists():
                anchor_model(n_layers, seed=seed + step).save_pretrained(path)
            series.append((run, step, path))
    out = {
        "contributions": probekit.contributions(model, tokens),
        "skip_effects": probekit.skip_effects(model, tokens),
        "residual_stats": probekit.residual_stats(model, tokens),
        "gradient_norms": probekit.gradient_norms(model, tokens),
        "layer_swaps": probekit.layer_swaps(model, tokens, pairs="adjacent", n_bootstrap=5),
        "logit_lens": logit,
        "tuned_lens": lens,
        "token_lens": probekit.token_lens(  # token-resolved lens
            model, tokens[:6], sites=("resid_out", "resid_mid"), targets={"answer": 5}
        ),
        "solutions": solution_types(model, TASK.solution_data()),
        "probes": linear_probes(
            model,
            TASK.generate("test_data", 160),
            sites=["resid"],
            positions="roles",
            probe="ridge",
        ),
        "token_masking": token_masking(model, held, by="role"),
        "attention_knockout": attention_knockout(model, held, by="role"),
        "information_flow": information_flow(model, held.tokens[:16], n_mean=16),
        "hidden_state_map": hidden_state_map(model, [seen, held], layers=[0, n_layers - 1]),
        "pair_cosines": pair_cosines(model, TASK.generate("test_data", 200), layers=[0]),
        "condensation": condensation(model, layers=[0, n_layers - 1], matrices=["W_Q", "W_in"]),
        "condensation_timeline": condensation_timeline([hf, later], steps=[100, 200]),
        "embedding_map": embedding_map(model, tokens=range(TASK.item_low, TASK.item_high)),
        "spectra": spectra(model),
        "depth_timeline": depth_timeline(series, tokens[:8]),
        "sweep": _sweep(),
        "depth_family": depth_family(1_000_000, [2, 4, 8, 12], d_model=64),
    }
    out["layer_similarity"] = probekit.layer_similarity(model, tokens)
    # --- activation patching and direct logit attribution ---
    swapped = held.tokens[:8].clone()
    where = held.positions[:8]
    rows = torch.arange(8)
    swapped[rows, where + 1], swapped[rows, where + 2] = (
        held.tokens[:8][rows, where + 2],
        held.tokens[:8][rows, where + 1],
    )
    answers = torch.stack([held.composite[:8], held.symmetric[:8]], -1)
    out["activation_patching"] = probekit.activation_patching(
        model, held.tokens[:8], swapped, sites=("resid_in", "attn_out"), answers=answers
    )
    out["direct_logit_attribution"] = probekit.direct_logit_attribution(
        model, held.tokens[:8], targets=answers
    )
    return out


def main(argv: list[str] | None = None) -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", default="2,12")
    parser.add_argument("--only", default="", help="comma-separated figure names")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.layers.split(",")):
            for name, draw in results(n, Path(tmp)).items():
                if only and name not in only:
                    continue
                fig = draw()
                width = min(1200, int(fig.layout.width or 1000))
                fig.write_image(out / f"{name}_L{n}.png", width=width)
                print(out / f"{name}_L{n}.png")


if __name__ == "__main__":
    main()

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
direct logit attribution. Per model it also prints the logit lens' log-probability of the
composite x-10 and of the symmetric x-6 at the last token after each depth (the token lens'
target curves) and, with ``--targets-figure``, draws them. ``--timing`` times the resid_out
grid against two ways by hand (interleaved, medians, CPU seconds, the load).

    PYTHONPATH=. python benchmarks/anchor_patching.py --figure assets/anchor_patching.png
    PYTHONPATH=. python benchmarks/anchor_patching.py --models symmetric,inferential \
        --targets-figure 'assets/anchor_target_curves_{name}.png' --timing
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# benchmarks.common first: it sets OMP_WAIT_POLICY before torch loads OpenMP
from benchmarks.common import interleaved, median, runs_line, timed_cpu, uptime  # noqa: E402, I001
import torch  # noqa: E402

import probekit  # noqa: E402
from probekit.demo import reference_configs  # noqa: E402

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


def block_outputs(hf, tokens: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every block's output ``[B, T, d]`` of a Hugging Face GPT-2 on ``tokens`` (forward hooks
    on its blocks) and the logits at the last position."""
    outs: list[torch.Tensor] = []
    handles = [
        block.register_forward_hook(
            lambda m, i, o: outs.append(o[0] if isinstance(o, tuple) else o)
        )
        for block in hf.transformer.h
    ]
    try:
        logits = hf(tokens).logits[:, -1]
    finally:
        for handle in handles:
            handle.remove()
    return outs, logits


def logit_difference(logits: torch.Tensor, answers: torch.Tensor) -> float:
    """Mean logit(composite) - logit(symmetric) over the sequences."""
    rows = torch.arange(len(answers))
    return float((logits[rows, answers[:, 0]] - logits[rows, answers[:, 1]]).mean())


def full_forward_patching(hf, clean, corrupted, answers) -> list[float]:
    """The resid_out grid with one full forward per layer x position, a forward hook on the
    block that overwrites its output at the position with the corrupted run's (what a plain
    loop of hooks does); the mean logit difference per cell, layer-major."""
    donor, _ = block_outputs(hf, corrupted)
    out = []
    for layer, block in enumerate(hf.transformer.h):
        for p in range(clean.shape[1]):

            def patch(module, inputs, output, layer=layer, p=p):
                hidden = (output[0] if isinstance(output, tuple) else output).clone()
                hidden[:, p] = donor[layer][:, p]
                return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

            handle = block.register_forward_hook(patch)
            try:
                out.append(logit_difference(hf(clean).logits[:, -1], answers))
            finally:
                handle.remove()
    return out


def prefix_reusing_patching(hf, clean, corrupted, answers) -> list[float]:
    """The same grid by hand, reusing the clean prefix: both runs' block outputs are read once,
    and each variant runs only the blocks after the patched one (a causal mask passed to
    each block, as the model does) and the final norm and head at the last position."""
    donor, _ = block_outputs(hf, corrupted)
    base, _ = block_outputs(hf, clean)
    n = clean.shape[1]
    mask = torch.full((n, n), torch.finfo(base[0].dtype).min).triu(1)[None, None]
    blocks = hf.transformer.h
    out = []
    for layer in range(len(blocks)):
        for p in range(n):
            hidden = base[layer].clone()
            hidden[:, p] = donor[layer][:, p]
            for block in blocks[layer + 1 :]:
                hidden = block(hidden, attention_mask=mask)
                hidden = hidden[0] if isinstance(hidden, tuple) else hidden
            logits = hf.lm_head(hf.transformer.ln_f(hidden[:, -1]))
            out.append(logit_difference(logits, answers))
    return out


def timing(path: Path, clean, corrupted, answers, repeats: int) -> None:
    """The resid_out grid three ways, interleaved (A B C C B A, ``repeats`` times, each way run
    once before): probekit, a hand-written script that reuses the clean prefix (the fastest
    way by hand) and a plain loop of full forwards; every run's wall and CPU seconds, the
    medians, the ratios and the largest difference from probekit's numbers."""
    from transformers import AutoModelForCausalLM

    model = probekit.load(path)
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    ways = {
        "probekit": lambda: list(
            probekit.activation_patching(model, clean, corrupted, answers=answers).df.value
        ),
        "by hand, clean prefix reused": lambda: prefix_reusing_patching(
            hf, clean, corrupted, answers
        ),
        "by hand, full forwards": lambda: full_forward_patching(hf, clean, corrupted, answers),
    }
    values = {}
    with torch.no_grad():
        for name, way in ways.items():
            values[name] = way()
        print(f"uptime before: {uptime()}")
        walls, cpus = defaultdict(list), defaultdict(list)
        for name in interleaved(list(ways), repeats):
            wall, cpu, _ = timed_cpu(ways[name])
            walls[name].append(wall)
            cpus[name].append(cpu)
            print(f"{name}: {wall:.3f} s wall, {cpu:.3f} s CPU", flush=True)
        print(f"uptime after: {uptime()}")
    print(f"resid_out grid ({len(clean)} sequences, {len(values['probekit'])} variants):")
    for name in ways:
        diff = max(abs(a - b) for a, b in zip(values[name], values["probekit"], strict=True))
        print(
            f"  {name:<30} wall {runs_line(walls[name])}; CPU median {median(cpus[name]):.3f} s;"
            f" {median(walls[name]) / median(walls['probekit']):.2f}x probekit's wall;"
            f" max |difference| {diff:.1e}"
        )


def target_curves(name: str, path: Path, clean, answers, figure: Path | None) -> None:
    """The logit lens' log-probability of the composite x-10 and of the symmetric x-6 at the
    last token after each depth (mean over the sequences), and, with ``figure``, the token
    lens figure of the first 16 sequences (their top tokens and the two curves)."""
    targets = {"x-10": answers[:, 0], "x-6": answers[:, 1]}
    res = probekit.token_lens(path, clean, targets=targets, positions="last")
    means = res.df.groupby("depth")[["logp_x-10", "logp_x-6", "top_prob"]].mean()
    print(f"-- {name}: mean log-probability at the last token after each depth (logit lens)")
    print(means.round(3).to_string())
    if figure is not None:
        few = {key: ids[:16] for key, ids in targets.items()}
        part = probekit.token_lens(path, clean[:16], targets=few, positions="last")
        part.figure().write_image(figure, width=900, height=700)
        print(f"figure written to {figure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/anchor-reference"))
    parser.add_argument("--key-position", type=int, default=3)
    parser.add_argument("--models", default="inferential", help="e.g. symmetric,inferential")
    parser.add_argument("--figure", type=Path, default=None)
    parser.add_argument(
        "--targets-figure",
        default=None,
        help="write each model's target-curve figure to this path, {name} replaced by its name",
    )
    parser.add_argument("--timing", action="store_true", help="also time two ways by hand")
    parser.add_argument("--repeats", type=int, default=3, help="A B C C B A rounds of --timing")
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
        out = args.targets_figure
        target_curves(name, path, clean, answers, Path(out.format(name=name)) if out else None)
        if "0.8" in name or "inferential" in name:
            dla = probekit.direct_logit_attribution(path, clean, targets=answers)
            print("direct logit attribution of logit(x-10) - logit(x-6) at the last token:")
            print(dla.df.round(3).to_string(index=False))
            if args.timing:
                timing(path, clean, corrupted, answers, args.repeats)
            if args.figure is not None:
                res.figure().write_image(args.figure, width=900, height=1400)
                print(f"figure written to {args.figure}")


if __name__ == "__main__":
    main()

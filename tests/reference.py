"""Slow, plain references computed on un-bridged Hugging Face models.

Nothing here imports probekit: layers are physically deleted or reordered in a copy of the
model, sublayers are silenced with ordinary torch forward hooks, and every measure is written
out from its definition, so the tests compare probekit against an independent computation.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

from tests.conftest import ENCODERS, hf_blocks, set_blocks


def logits(hf, tokens, mask):
    with torch.no_grad():
        return hf(input_ids=tokens, attention_mask=mask, use_cache=False).logits


def labels_for(arch: str, tokens, mask):
    """Next real token for decoders, the token itself for masked LMs (BERT, RoBERTa); -100
    where there is none."""
    out = torch.full_like(tokens, -100)
    for b in range(tokens.shape[0]):
        for t in range(tokens.shape[1]):
            if arch in ENCODERS:
                if mask[b, t]:
                    out[b, t] = tokens[b, t]
            elif t + 1 < tokens.shape[1] and mask[b, t] and mask[b, t + 1]:
                out[b, t] = tokens[b, t + 1]
    return out


def without_layer(hf, layer: int):
    model = copy.deepcopy(hf)
    blocks = list(hf_blocks(model))
    del blocks[layer]
    set_blocks(model, blocks)
    return model


def with_order(hf, order):
    model = copy.deepcopy(hf)
    blocks = list(hf_blocks(model))
    set_blocks(model, [blocks[i] for i in order])
    return model


SANDWICH = ("gemma2", "gemma3", "olmo2")
"""Families whose blocks norm each sublayer's output before adding it to the stream."""

STATE_SUBLAYERS = ("bloom",)
"""Families whose attention and MLP modules return the stream with their update added."""


# --- paper architecture: post-LN OPT ---
POST_LN = ("opt_post_norm", "post_ln_paper")
"""Post-LN OPT families (probekit's post_ln_paper model): ``h_mid = LN1(h_in + attn)`` is the
first LayerNorm's output, ``h_out = LN2(h_mid + mlp)``; zeroing a sublayer's update makes
that sublayer, its LayerNorm included, the identity (``h_mid = h_in``, ``h_out = h_mid``)."""


@contextmanager
def post_ln_replaced(block, sublayer: str, make=None):
    """Replace one sublayer of a post-LN OPT block by a plain hook on its LayerNorm: the
    LayerNorm returns ``make(base, output)``, ``base`` the stream the sublayer got (the block
    input for attention, the mid-block stream for the MLP); ``make=None`` returns ``base``
    (the sublayer silenced: its update is zero)."""
    held = {}

    def keep(mod, args, kwargs):
        held["base"] = (args[0] if args else kwargs["hidden_states"]).detach()

    def pass_on(mod, args, kwargs, output):
        base = held["base"].reshape(output.shape)
        return base if make is None else make(base, output)

    reads = block if sublayer == "attn" else block.fc1
    norm = block.self_attn_layer_norm if sublayer == "attn" else block.final_layer_norm
    first = reads.register_forward_pre_hook(keep, with_kwargs=True)
    last = norm.register_forward_hook(pass_on, with_kwargs=True)
    try:
        yield
    finally:
        first.remove()
        last.remove()


def sublayer_modules(block, arch: str) -> dict:
    """The plain HF modules whose outputs are the attention and MLP updates of a block; for
    encoders the attention module whose output is the mid-block stream."""
    if arch in POST_LN:  # the LayerNorms' outputs: the mid-block stream and the block output
        return {"attn": block.self_attn_layer_norm, "mlp": block.final_layer_norm}
    if arch in ENCODERS:
        return {"attn": block.attention, "mlp": block.output}
    if arch in SANDWICH:
        return {"attn": block.post_attention_layernorm, "mlp": block.post_feedforward_layernorm}
    names = ("attn", "self_attn", "attention", "self_attention")
    attn = next(getattr(block, n) for n in names if hasattr(block, n))
    return {"attn": attn, "mlp": getattr(block, "mlp", None) or block.fc2}


@contextmanager
def silenced(hf, arch: str, layer: int, sublayer: str):
    """Remove one sublayer's update with a plain torch forward hook."""
    block = hf_blocks(hf)[layer]
    if arch in POST_LN:
        with post_ln_replaced(block, sublayer):
            yield hf
        return
    if arch in ENCODERS:
        if sublayer == "attn":
            module = block.attention

            def hook(mod, args, kwargs, output):
                hidden = args[0] if args else kwargs["hidden_states"]
                return (hidden,) + tuple(output[1:]) if isinstance(output, tuple) else hidden
        else:
            module = block.output

            def hook(mod, args, kwargs, output):
                return args[1] if len(args) > 1 else kwargs["input_tensor"]
    elif arch in STATE_SUBLAYERS:  # the module adds its own residual: return the residual
        module = sublayer_modules(block, arch)[sublayer]

        def hook(mod, args, kwargs, output):
            residual = args[1] if len(args) > 1 else kwargs["residual"]
            return (residual,) + tuple(output[1:]) if isinstance(output, tuple) else residual
    else:
        module = sublayer_modules(block, arch)[sublayer]

        def hook(mod, args, kwargs, output):
            if isinstance(output, tuple):
                return (torch.zeros_like(output[0]),) + tuple(output[1:])
            return torch.zeros_like(output)

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        yield hf
    finally:
        handle.remove()


def updates(hf, arch: str, tokens, mask):
    """Per block: (h_in, a, m, h_out) from plain hooks on the HF sublayer modules, with
    h_out = h_in + a + m by the definition of each family's block."""
    outs = {}
    handles = []
    for i, block in enumerate(hf_blocks(hf)):
        for key, module in sublayer_modules(block, arch).items():

            def hook(mod, args, output, key=key, i=i):
                # a copy: Falcon adds the attention output to the MLP output in place
                outs[i, key] = (output[0] if isinstance(output, tuple) else output).detach().clone()

            handles.append(module.register_forward_hook(hook))
    try:
        ins, block_outs, _ = block_io(hf, tokens, mask)
    finally:
        for h in handles:
            h.remove()
    result = []
    for i in range(len(ins)):
        h, out = ins[i].double(), block_outs[i].double()
        if arch in ENCODERS or arch in STATE_SUBLAYERS or arch in POST_LN:  # mid-block stream
            mid = outs[i, "attn"].double()
            result.append((h, mid - h, out - mid, out))
        else:
            a, m = (outs[i, key].double().reshape(h.shape) for key in ("attn", "mlp"))
            result.append((h, a, m, out))
    return result


def truncated_logits(hf, depth: int, tokens, mask):
    """Logits of the plain model with only its first ``depth`` blocks (the logit lens at depth
    ``depth``: the model's own final norm and head applied to that residual)."""
    return logits(with_order(hf, list(range(depth))), tokens, mask)


def block_io(hf, tokens, mask):
    """Inputs and outputs of every block of a plain HF model, from ordinary torch hooks."""
    ins, outs = {}, {}
    handles = []
    for i, block in enumerate(hf_blocks(hf)):

        def pre(mod, args, kwargs, i=i):
            ins[i] = (args[0] if args else kwargs["hidden_states"]).detach()

        def post(mod, args, kwargs, output, i=i):
            outs[i] = (output[0] if isinstance(output, tuple) else output).detach()

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(post, with_kwargs=True))
    try:
        z = logits(hf, tokens, mask)
    finally:
        for h in handles:
            h.remove()
    return ins, outs, z


def final_head(hf, arch: str, residual):
    """Logits from a final residual of a plain HF model."""
    with torch.no_grad():
        if arch == "gpt2":
            return hf.lm_head(hf.transformer.ln_f(residual))
        if arch == "llama":
            return hf.lm_head(hf.model.norm(residual))
        if arch in POST_LN:  # no final norm: the last block's output is already normalised
            return hf.lm_head(residual)
        return hf.cls(residual)


def mean_over(values, mask):
    """Plain mean of a [B, T] tensor over the True entries of mask."""
    total, count = 0.0, 0
    for b in range(values.shape[0]):
        for t in range(values.shape[1]):
            if mask[b, t]:
                total += float(values[b, t])
                count += 1
    return total / count


def measures(clean, changed, labels):
    """Per-token output measures written from their definitions."""
    p = torch.softmax(clean.double(), -1)
    q = torch.softmax(changed.double(), -1)
    ce = torch.nn.functional.cross_entropy
    flat_labels = labels.reshape(-1)
    loss_clean = ce(
        clean.double().reshape(-1, clean.shape[-1]), flat_labels.clamp(min=0), reduction="none"
    ).reshape(labels.shape)
    loss_changed = ce(
        changed.double().reshape(-1, clean.shape[-1]), flat_labels.clamp(min=0), reduction="none"
    ).reshape(labels.shape)
    return {
        "logit_l2": torch.sqrt(((changed.double() - clean.double()) ** 2).sum(-1)),
        "kl": (p * (torch.log(p) - torch.log(q))).sum(-1),
        "prob_l2": torch.sqrt(((q - p) ** 2).sum(-1)),
        "loss_delta": loss_changed - loss_clean,
    }


def measures_log_space(clean, changed, labels):
    """The per-token output measures in float64 from log-probabilities: exact for any finite
    logits (nothing overflows: probabilities are exponentials of values <= 0; a probability
    that underflows to 0 contributes 0 to the KL sum, never 0 * inf). Loss change 0 where a
    label is -100."""
    z, zq = clean.double(), changed.double()
    logp, logq = torch.log_softmax(z, -1), torch.log_softmax(zq, -1)
    p, q = torch.exp(logp), torch.exp(logq)
    y = labels.clamp(min=0)[..., None]
    loss = (torch.gather(logp, -1, y) - torch.gather(logq, -1, y))[..., 0]
    return {
        "logit_l2": torch.sqrt(((zq - z) ** 2).sum(-1)),
        "kl": torch.where(p > 0, p * (logp - logq), 0.0).sum(-1),
        "prob_l2": torch.sqrt(((q - p) ** 2).sum(-1)),
        "loss_delta": torch.where(labels != -100, loss, 0.0),
    }


# ---- Csordas, Manning & Potts 2025 conventions (issue 11) ----------------------------------
# A port of the formulas of github.com/RobertCsordas/llm_effective_depth, analysis/
# (analyze_future_effects.py: merge_io, intervene_layer, test_effect, test_future_max_effect;
# skip_max_depth.py: the depth scores; logitlens.py; analyze_norms.py), run one prompt at a
# time (no padding) on a plain HF model with hand-written torch hooks.


def _merge_front(intervened, orig, t, no_skip_front: int = 1):
    """merge_io: orig before no_skip_front, intervened up to t, orig from t on."""
    outs = [orig[:, :no_skip_front]]
    if t is not None:
        outs += [intervened[:, no_skip_front:t], orig[:, t:]]
    else:
        outs.append(intervened[:, no_skip_front:])
    return torch.cat(outs, dim=1)


def _csordas_hook(hf, layer: int, part: str, t, no_skip_front: int):
    """intervene_layer as a torch forward hook; returns the handle."""
    block = hf_blocks(hf)[layer]
    if part == "layer":
        module = block

        def hook(mod, args, kwargs, output):
            inp = args[0] if args else kwargs["hidden_states"]
            out = output[0] if isinstance(output, tuple) else output
            new = _merge_front(inp, out, t, no_skip_front)
            return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new
    else:
        if part == "mlp":
            module = block.mlp
        else:
            module = getattr(block, "attn", None) or getattr(block, "self_attn", None)

        def hook(mod, args, kwargs, output):
            out = output[0] if isinstance(output, tuple) else output
            new = _merge_front(torch.zeros_like(out), out, t, no_skip_front)
            return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    return module.register_forward_hook(hook, with_kwargs=True)


def _updates(hf, ids):
    """D_l = block output - block input for every layer, [L, T, d], and the logits [T, V]."""
    ins, outs, z = block_io(hf, ids, torch.ones_like(ids))
    return torch.cat([outs[i] - ins[i] for i in range(len(ins))], dim=0), z[0]


def csordas_test_effect(hf, ids, ts, part: str = "layer", no_skip_front: int = 1):
    """test_effect for one prompt ``ids`` [1, T]: per skipped layer and affected layer the max
    over t in ``ts`` (None = current mode) of the max over positions >= t of
    ||D_l - D'_l|| / max(||D_l||, 1e-6); and per skipped layer the same max of
    ||softmax(z') - softmax(z)||."""
    clean, z = _updates(hf, ids)
    probs = z.double().softmax(-1)
    all_diffs, all_out = [], []
    for t in ts:
        s = 0 if t is None else t
        diffs, out_diffs = [], []
        for lskip in range(clean.shape[0]):
            handle = _csordas_hook(hf, lskip, part, t, no_skip_front)
            try:
                new, z_new = _updates(hf, ids)
            finally:
                handle.remove()
            num = (clean[:, s:] - new[:, s:]).double().norm(dim=-1)
            rel = num / clean[:, s:].double().norm(dim=-1).clamp(min=1e-6)
            diffs.append(rel.max(dim=-1).values)
            change = (z_new[s:].double().softmax(-1) - probs[s:]).norm(dim=-1)
            out_diffs.append(change.max())
        all_diffs.append(torch.stack(diffs))
        all_out.append(torch.stack(out_diffs))
    return torch.stack(all_diffs).max(dim=0).values, torch.stack(all_out).max(dim=0).values


def csordas_future_positions(length: int, rng, n_chunks: int = 4):
    """test_future_max_effect's positions: range(8, T-4, 8) shuffled, the first n_chunks."""
    positions = list(range(8, length - 4, 8))
    rng.shuffle(positions)
    return positions[:n_chunks]


def csordas_effects(
    hf, prompts, mode: str, part: str = "layer", seed=123, starts=None, n_chunks: int = 4
):
    """Per prompt (1-D token tensors, no padding): (matrix [L, L], output [L]) or None for a
    prompt too short for future mode; the reference crashes on those, probekit skips them.
    ``starts``: per prompt an int (skip_max_depth.py's answer start) or a list of positions
    (its Math variant); else positions are drawn from ``random.Random(seed)``, or from
    ``seed`` itself when it is a random stream (the ``random`` module, continuing its draws)."""
    import random

    rng = random.Random(seed) if isinstance(seed, int) else seed
    per_prompt = []
    for i, prompt in enumerate(prompts):
        if mode == "current":
            ts = [None]
        elif starts is not None:
            ts = [starts[i]] if isinstance(starts[i], int) else list(starts[i])
        else:
            ts = csordas_future_positions(len(prompt), rng, n_chunks)
        per_prompt.append(csordas_test_effect(hf, prompt[None], ts, part) if ts else None)
    return per_prompt


def csordas_future_run(hf, prompts, seed: int = 123, n_chunks: int = 4) -> dict:
    """analyze_future_effects.py's run(): ``random.seed(seed)`` once, then the parts in its
    order (layer, mlp, attention), each over all prompts, so each part's positions continue
    the stream where the previous part's left it. Returns {part: per-prompt effects}; the
    global ``random`` state is restored afterwards."""
    import random

    state = random.getstate()
    try:
        random.seed(seed)
        return {
            part: csordas_effects(hf, prompts, "future", part, seed=random, n_chunks=n_chunks)
            for part in ("layer", "mlp", "attention")
        }
    finally:
        random.setstate(state)


def csordas_max_over_prompts(per_prompt):
    """run(): d_max = max(d_max, diff_now) from zeros, for the matrix and the output effect."""
    kept = [p for p in per_prompt if p is not None]
    d_max = torch.stack([p[0] for p in kept]).max(dim=0).values.clamp(min=0)
    out_max = torch.stack([p[1] for p in kept]).max(dim=0).values.clamp(min=0)
    return d_max, out_max


def csordas_depth_scores(d_all, out_all):
    """skip_max_depth.py: dall_reduce = d.sum(-1) / arange(L-1, -1, -1).clamp(min=1), and
    effect_layer_score (centre of mass) of it and of the output effect."""
    n = d_all.shape[0]
    reduce = d_all.sum(-1) / torch.arange(n - 1, -1, -1).clamp(min=1)

    def score(m):
        return float((torch.arange(m.shape[0]) * m).sum() / m.sum())

    return score(reduce), score(out_all)


def csordas_logit_lens(hf, arch: str, prompts, k: int = 5):
    """logitlens.py: per prompt the token mean of KL(p_l || p_final) and of the top-k overlap
    (one-hot products), for the input of every layer and the final residual; then the mean
    over prompts. Returns ([L+1] KL, [L+1] overlap)."""
    kls, overlaps = [], []
    for prompt in prompts:
        ids = prompt[None]
        ins, outs, z = block_io(hf, ids, torch.ones_like(ids))
        taps = [ins[i] for i in range(len(ins))] + [outs[len(ins) - 1]]
        lout = z.double().log_softmax(-1)
        real_oh = torch.nn.functional.one_hot(lout.topk(k, -1).indices, z.shape[-1]).sum(-2)
        kl_row, ov_row = [], []
        for tap in taps:
            llayer = final_head(hf, arch, tap).double().log_softmax(-1)
            kl_row.append((llayer.exp() * (llayer - lout)).sum(-1).mean())
            oh = torch.nn.functional.one_hot(llayer.topk(k, -1).indices, z.shape[-1]).sum(-2)
            ov_row.append(((oh.unsqueeze(-2).double() @ real_oh.unsqueeze(-1).double()) / k).mean())
        kls.append(torch.stack(kl_row))
        overlaps.append(torch.stack(ov_row))
    return torch.stack(kls).mean(0), torch.stack(overlaps).mean(0)


def csordas_update_cosine(hf, prompts):
    """analyze_norms.py's layer_cos: cos(layer output - layer input, layer input) summed over
    the tokens of every prompt and divided by the token count. Returns [L]."""
    total, count = 0.0, 0
    for prompt in prompts:
        ids = prompt[None]
        ins, outs, _ = block_io(hf, ids, torch.ones_like(ids))
        cos = [
            torch.nn.functional.cosine_similarity(
                (outs[i] - ins[i]).double(), ins[i].double(), dim=-1
            ).sum(1)
            for i in range(len(ins))
        ]
        total = total + torch.cat(cos)
        count += ids.shape[1]
    return total / count


def csordas_norm_stats(hf, arch: str, prompts) -> dict:
    """analyze_norms.py: per layer, with h the block input, a and m the attention and MLP
    outputs and D = block output - h, the token sums over every prompt divided by the token
    count of ||a|| / max(||h||, 1e-6), ||m|| / max(||h + a||, 1e-6), ||D|| / max(||h||, 1e-6)
    and torch's cosine_similarity with its default eps of (a, h), (m, h + a), (D, h) and
    (block output, h). Returns {probekit's measure name: [L]}."""
    sums: dict = {}
    count = 0
    for prompt in prompts:
        ids = prompt[None]
        rows: dict = {}
        for h, a, m, out in updates(hf, arch, ids, torch.ones_like(ids)):
            d, mid = out - h, h + a
            cos = torch.nn.functional.cosine_similarity  # eps=1e-8, torch's default
            found = {
                "attn_rel": a.norm(dim=-1) / h.norm(dim=-1).clamp(min=1e-6),
                "mlp_rel": m.norm(dim=-1) / mid.norm(dim=-1).clamp(min=1e-6),
                "update_rel": d.norm(dim=-1) / h.norm(dim=-1).clamp(min=1e-6),
                "cos_attn_in": cos(a, h, dim=-1),
                "cos_mlp_mid": cos(m, mid, dim=-1),
                "cos_update_in": cos(d, h, dim=-1),
                "cos_out_in": cos(out, h, dim=-1),
            }
            for name, values in found.items():
                rows.setdefault(name, []).append(values.sum(1))
        for name, per_layer in rows.items():
            sums[name] = sums.get(name, 0) + torch.cat(per_layer)
        count += ids.shape[1]
    return {name: total / count for name, total in sums.items()}


# ---- end of the Csordas et al. 2025 block ---------------------------------------------------


# ---- tuned lens -----------------------------------------------------------------------------
def _head_with_grad(hf, arch: str, residual):
    """final_head without no_grad (the translators before it are being trained)."""
    if arch == "gpt2":
        return hf.lm_head(hf.transformer.ln_f(residual))
    if arch == "llama":
        return hf.lm_head(hf.model.norm(residual))
    if arch in POST_LN:  # no final norm
        return hf.lm_head(residual)
    return hf.cls(residual)


def tuned_lens_fit(hf, arch, batches, *, steps, lr, seed, momentum=0.9, wd=1e-3, clip=1.0):
    """Train tuned-lens translators A_d, b_d (T_d(h) = h + h A_d^T + b_d, depths 0..L-1) of a
    plain HF model by hand: KL(p_final || p_d) averaged over real tokens and summed over depths,
    the joint gradient clipped to norm ``clip``, SGD with Nesterov momentum and weight decay
    written out, learning rate ``lr * (steps - s) / steps`` at step s, and batches visited in
    passes of ``torch.randperm`` drawn from a generator seeded with ``seed``.

    ``batches`` is a list of (tokens, mask); returns [(A_d, b_d)] per depth and the summed
    loss of every step."""
    n, d = len(hf_blocks(hf)), hf.config.hidden_size
    params = [p for i in range(n) for p in (torch.zeros(d, d), torch.zeros(d))]
    momentum_buf = [None] * len(params)
    g = torch.Generator().manual_seed(seed)
    order = []
    while len(order) < steps:
        order += torch.randperm(len(batches), generator=g).tolist()
    history = []
    for step in range(steps):
        tokens, mask = batches[order[step]]
        ins, _, final = block_io(hf, tokens, mask)
        real = mask.bool()
        logp = final[real].float().log_softmax(-1)
        leaves = [p.clone().requires_grad_(True) for p in params]
        total = 0.0
        for depth in range(n):
            h = ins[depth][real]
            a, b = leaves[2 * depth], leaves[2 * depth + 1]
            logq = _head_with_grad(hf, arch, h + h @ a.T + b).float().log_softmax(-1)
            total = total + (logp.exp() * (logp - logq)).sum(-1).mean()
        grads = torch.autograd.grad(total, leaves)
        norm = torch.sqrt(sum(gr.pow(2).sum() for gr in grads))
        scale = min(1.0, float(clip / (norm + 1e-6)))
        rate = lr * (steps - step) / steps
        for i, (p, gr) in enumerate(zip(params, grads, strict=True)):
            gr = gr * scale + wd * p
            momentum_buf[i] = gr if momentum_buf[i] is None else momentum * momentum_buf[i] + gr
            params[i] = p - rate * (gr + momentum * momentum_buf[i])
        history.append(float(total.detach()))
    return [(params[2 * i], params[2 * i + 1]) for i in range(n)], history


# ---- models without an LM head (issue 9) -----------------------------------------------------
def base_blocks(base) -> tuple:
    """The block list of a plain base model (GPT2Model.h, LlamaModel.layers, BertModel's
    encoder.layer) and its owner."""
    for owner in (base, getattr(base, "encoder", None), getattr(base, "decoder", None)):
        for name in ("h", "layers", "layer"):
            if isinstance(getattr(owner, name, None), torch.nn.ModuleList):
                return owner, name
    raise ValueError(f"no block list in {type(base).__name__}")


def base_without_layer(base, layer: int):
    """A copy of the base model with block ``layer`` physically deleted."""
    model = copy.deepcopy(base)
    owner, name = base_blocks(model)
    blocks = list(getattr(owner, name))
    del blocks[layer]
    setattr(owner, name, torch.nn.ModuleList(blocks))
    model.config.num_hidden_layers = len(blocks)
    return model


def last_hidden(base, tokens, mask):
    """``last_hidden_state`` of the plain base model."""
    with torch.no_grad():
        return base(input_ids=tokens, attention_mask=mask, use_cache=False).last_hidden_state


def pooled(hidden, mask, mode: str, normalize: bool):
    """sentence-transformers pooling written out: mean over real tokens, the first token, or
    the last real token (right padding), then unit norm."""
    rows = []
    for b in range(hidden.shape[0]):
        real = hidden[b, : int(mask[b].sum())]
        rows.append({"mean": real.mean(0), "cls": real[0], "lasttoken": real[-1]}[mode])
    out = torch.stack(rows)
    return out / out.norm(dim=-1, keepdim=True) if normalize else out


def relative_changes(clean, changed):
    """||z' - z|| / ||z|| per vector (float64)."""
    clean, changed = clean.double(), changed.double()
    return (changed - clean).norm(dim=-1) / clean.norm(dim=-1)


# --- activation patching and direct logit attribution ---
PATCH_SITES = ("resid_in", "resid_mid", "resid_out", "attn_out", "mlp_out")


def site_activations(hf, arch: str, tokens, mask) -> dict:
    """``{(site, layer): [B, T, d]}`` of one plain forward (float64), from :func:`updates`."""
    out = {}
    for layer, (h, a, m, h_out) in enumerate(updates(hf, arch, tokens, mask)):
        out.update(
            {
                ("resid_in", layer): h,
                ("resid_mid", layer): h + a,
                ("resid_out", layer): h_out,
                ("attn_out", layer): a,
                ("mlp_out", layer): m,
            }
        )
    return out


def _overwrite(tensor, cells, value):
    """``tensor`` with ``value`` at the (row, position) ``cells``."""
    out = tensor.clone()
    for b, p in cells:
        out[b, p] = value[b, p].to(out.dtype)
    return out


def _replace_output(output, make):
    if isinstance(output, tuple):
        return (make(output[0]),) + tuple(output[1:])
    return make(output)


def patched_logits(hf, arch: str, tokens, mask, site: str, layer: int, cells, source):
    """Logits of ONE plain forward of ``tokens`` with ``site`` of ``layer`` overwritten at the
    (row, position) ``cells`` by ``source`` (the other run's activation there), by torch
    forward hooks on the HF modules: the block's input (resid_in), its output (resid_out), the
    attention or MLP module's output (attn_out, mlp_out), and for resid_mid the attention
    output set so that block input + attention output = the source's mid-block residual."""
    block = hf_blocks(hf)[layer]
    modules = sublayer_modules(block, arch)
    handles, held = [], {}
    if site == "resid_in":

        def pre(mod, args, kwargs):
            if args:
                return (_overwrite(args[0], cells, source),) + tuple(args[1:]), kwargs
            return args, {
                **kwargs,
                "hidden_states": _overwrite(kwargs["hidden_states"], cells, source),
            }

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
    elif site == "resid_out":

        def post(mod, args, kwargs, output):
            return _replace_output(output, lambda t: _overwrite(t, cells, source))

        handles.append(block.register_forward_hook(post, with_kwargs=True))
    elif site in ("attn_out", "mlp_out"):
        module = modules["attn" if site == "attn_out" else "mlp"]

        def post(mod, args, kwargs, output):
            return _replace_output(output, lambda t: _overwrite(t, cells, source))

        handles.append(module.register_forward_hook(post, with_kwargs=True))
    else:  # resid_mid (pre-norm decoders): attention output := source mid - block input

        def keep(mod, args, kwargs):
            held["h"] = (args[0] if args else kwargs["hidden_states"]).detach().double()

        def post(mod, args, kwargs, output):
            wanted = source - held["h"]
            return _replace_output(output, lambda t: _overwrite(t, cells, wanted))

        handles.append(block.register_forward_pre_hook(keep, with_kwargs=True))
        handles.append(modules["attn"].register_forward_hook(post, with_kwargs=True))
    try:
        return logits(hf, tokens, mask)
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def direct_logit_terms(hf, arch: str, tokens, mask, rows, positions, direction):
    """Embedding, per-layer attention and MLP, and bias terms of the logit along
    ``direction`` ``[B, V]`` (weights over the vocabulary, e.g. one-hot or +1/-1) at
    ``positions`` ``[B]``, computed by hand: the final norm (GPT-2 LayerNorm or Llama
    RMSNorm) with its scale frozen at the clean final residual, then ``lm_head``."""
    ups = updates(hf, arch, tokens, mask)
    final = ups[-1][3][rows, positions]
    if arch == "gpt2":
        norm, centre = hf.transformer.ln_f, True
        eps = norm.eps
    else:
        norm, centre = hf.model.norm, False
        eps = norm.variance_epsilon
    x = final - final.mean(-1, keepdim=True) if centre else final
    scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    w_u = hf.lm_head.weight.double()  # [V, d]
    along = direction.double() @ w_u  # [B, d]
    gain = norm.weight.double()

    def term(t):
        t = t[rows, positions]
        if centre:
            t = t - t.mean(-1, keepdim=True)
        return ((t * gain / scale) * along).sum(-1)

    out = {("embedding", -1): term(ups[0][0])}
    for layer, (_, a, m, _) in enumerate(ups):
        out[("attn", layer)] = term(a)
        out[("mlp", layer)] = term(m)
    bias = torch.zeros(len(rows), dtype=torch.float64)
    if getattr(norm, "bias", None) is not None:
        bias = bias + (norm.bias.double() * along).sum(-1)
    if hf.lm_head.bias is not None:
        bias = bias + direction.double() @ hf.lm_head.bias.double()
    out[("bias", -1)] = bias
    return out


# --- token-resolved lens ---------------------------------------------------------------------
def token_lens_residuals(hf, arch: str, tokens, mask, site: str):
    """Per depth the residual a token lens reads at ``site`` of a plain HF model: for
    ``resid_out`` the input of block 0, then each block's output (depth 0 .. L, the last
    being the final residual); for ``resid_mid`` each block's input plus its attention
    output, from plain forward hooks on the attention modules (depth 0 .. L-1). Also the
    model's own final logits."""
    if site == "resid_out":
        ins, outs, final = block_io(hf, tokens, mask)
        return [ins[0]] + [outs[i] for i in range(len(outs))], final
    dtype = next(hf.parameters()).dtype  # updates() are float64 copies
    mids = [(h + a).to(dtype) for h, a, _, _ in updates(hf, arch, tokens, mask)]
    return mids, logits(hf, tokens, mask)


def token_lens_reference(hf, arch: str, tokens, mask, site: str, translators=None, targets=None):
    """Per depth, ``[B, T]`` tensors of the lens' top id, top probability, entropy,
    cross-entropy to the next real token (NaN where none), KL(final || lens) and the
    log-probability of each target id (``targets``: name -> one id per sequence), written from
    their definitions in float64. The lens logits are the final norm + head applied to the
    residual (``final_head``), after ``h + W h + b`` with ``translators[d] = (W, b)`` when
    given; at ``resid_out``'s last depth the model's own output."""
    residuals, final = token_lens_residuals(hf, arch, tokens, mask, site)
    labels = labels_for(arch, tokens, mask)
    logp = torch.log_softmax(final.double(), -1)
    out = []
    for depth, h in enumerate(residuals):
        if site == "resid_out" and depth == len(residuals) - 1:
            z = final
        else:
            if translators is not None and depth < len(translators):
                w, b = translators[depth]
                h = (h.float() + h.float() @ w.T + b).to(h.dtype)
            z = final_head(hf, arch, h)
        logq = torch.log_softmax(z.double(), -1)
        q = torch.exp(logq)
        top_prob, top_id = q.max(-1)
        picked = torch.gather(logq, -1, labels.clamp(min=0)[..., None])[..., 0]
        row = {
            "top_id": top_id,
            "top_prob": top_prob,
            "entropy": -(q * logq).sum(-1),
            "cross_entropy": torch.where(labels != -100, -picked, float("nan")),
            "kl_final": (torch.exp(logp) * (logp - logq)).sum(-1),
            "final_id": logp.argmax(-1),
        }
        for name, ids in (targets or {}).items():
            index = torch.tensor(ids)[:, None, None].expand(-1, tokens.shape[1], 1)
            row[f"logp_{name}"] = torch.gather(logq, -1, index)[..., 0]
        out.append(row)
    return out


def prediction_depth_reference(top_ids, final_ids):
    """The first depth from which ``top_ids[d] == final_ids`` for every later depth, or None
    (a plain loop over depths, last to first)."""
    settled = None
    for depth in range(len(top_ids) - 1, -1, -1):
        if top_ids[depth] != final_ids:
            break
        settled = depth
    return settled


# --- layer similarity ---
def _block_list(hf):
    """The block list of a plain HF model, with or without its LM head."""
    for owner in (hf, *(getattr(hf, n, None) for n in ("transformer", "model", "bert"))):
        if owner is None:
            continue
        for inner in (owner, getattr(owner, "encoder", None), getattr(owner, "decoder", None)):
            for name in ("h", "layers", "layer"):
                if isinstance(getattr(inner, name, None), torch.nn.ModuleList):
                    return getattr(inner, name)
    raise ValueError(f"no block list in {type(hf).__name__}")


def residual_states(hf, tokens, mask):
    """The residual stream of every depth ``[L + 1]`` x ``[B, T, d]``: HF's
    ``output_hidden_states`` for the embeddings and the blocks but the last, whose output is
    read with a forward hook (HF's last hidden state has the final norm applied)."""
    kept = {}

    def hook(module, args, output):
        kept["last"] = (output[0] if isinstance(output, tuple) else output).detach()

    handle = _block_list(hf)[-1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = hf(input_ids=tokens, attention_mask=mask, output_hidden_states=True)
    finally:
        handle.remove()
    return [h.detach() for h in out.hidden_states[:-1]] + [kept["last"]]


def selected(states, mask, last: bool = False):
    """The ``[n, d]`` float64 states of the real tokens (or each row's last real one), in
    row-major order."""
    chosen = mask.bool().clone()
    if last:
        chosen[:] = False
        for b in range(mask.shape[0]):
            chosen[b, int(mask[b].nonzero().max())] = True
    return [s[chosen].double() for s in states], chosen


def hsic_textbook(x, y, debiased: bool):
    """HSIC from the n x n Gram matrices: tr(KHLH) / (n - 1)^2, or the unbiased estimator of
    Song et al. (2012) with zero-diagonal Gram matrices."""
    n = x.shape[0]
    k, l_ = x @ x.T, y @ y.T
    if not debiased:
        h = torch.eye(n, dtype=x.dtype) - 1.0 / n
        return float(torch.trace(k @ h @ l_ @ h)) / (n - 1) ** 2
    k = k - torch.diag(torch.diag(k))
    l_ = l_ - torch.diag(torch.diag(l_))
    one = torch.ones(n, dtype=x.dtype)
    value = (
        torch.trace(k @ l_)
        + (one @ k @ one) * (one @ l_ @ one) / ((n - 1) * (n - 2))
        - 2.0 / (n - 2) * (one @ k @ l_ @ one)
    )
    return float(value) / (n * (n - 3))


def cka_textbook(x, y, debiased: bool = True):
    return (
        hsic_textbook(x, y, debiased)
        / (hsic_textbook(x, x, debiased) * hsic_textbook(y, y, debiased)) ** 0.5
    )


def centred_cosine(x, y):
    x, y = x - x.mean(0), y - y.mean(0)
    cos = (x * y).sum(1) / (x.norm(dim=1).clamp_min(1e-12) * y.norm(dim=1).clamp_min(1e-12))
    return float(cos.mean())


def map_r2(x, y, train, test):
    """Held-out R² of a plain numpy least-squares affine map from x to y."""
    import numpy as np

    design = np.concatenate([x.numpy(), np.ones((x.shape[0], 1))], axis=1)
    w, *_ = np.linalg.lstsq(design[train.numpy()], y.numpy()[train.numpy()], rcond=None)
    target = y.numpy()[test.numpy()]
    error = ((design[test.numpy()] @ w - target) ** 2).sum()
    return float(1.0 - error / ((target - target.mean(0)) ** 2).sum())


def similarity_matrix(xs, ys, measure: str, debiased: bool = True, train=None, test=None):
    """The matrix of one measure between every state in ``xs`` (rows) and ``ys`` (columns)."""

    def one(x, y):
        if measure == "cka":
            return cka_textbook(x, y, debiased)
        if measure == "cosine":
            return centred_cosine(x, y)
        return map_r2(x, y, train, test)

    return torch.tensor([[one(x, y) for y in ys] for x in xs], dtype=torch.float64)


# --- published tuned lenses (issue 34, item 2) ---
def package_lens_logits(hf, arch: str, tokens, mask, params: dict) -> list:
    """The logits of a tuned-lens package lens at every depth 0..L of a plain HF model, written
    out as the package defines them: depth i < L reads ``hidden_states[i]`` (the input of block
    i) as the model's final norm and unembedding of ``h + h W_i^T + b_i`` (``params`` holds the
    package's ``"{i}.weight"`` / ``"{i}.bias"``); depth L, which has no translator, is the
    model's output."""
    with torch.no_grad():
        out = hf(input_ids=tokens, attention_mask=mask, output_hidden_states=True, use_cache=False)
    n = len(hf_blocks(hf))
    lens = []
    for i in range(n):
        h = out.hidden_states[i]
        translated = h + h @ params[f"{i}.weight"].T + params[f"{i}.bias"]
        lens.append(final_head(hf, arch, translated))
    return [*lens, out.logits]


# --- ablation kinds (issue 34, item 3) ---------------------------------------------------------
def ablation_means(hf, arch: str, tokens, mask) -> dict:
    """Per (layer, part) the mean update over the real tokens (float64): the attention
    ('attn') and MLP ('mlp') updates and the whole block's ('layer': output minus input)."""
    valid = mask.bool()
    out = {}
    for i, (h, a, m, h_out) in enumerate(updates(hf, arch, tokens, mask)):
        for part, update in (("attn", a), ("mlp", m), ("layer", h_out - h)):
            out[i, part] = update[valid].mean(0)
    return out


def clean_update_table(hf, arch: str, tokens, mask) -> dict:
    """Per (layer, part) the clean update ``[B, T, d]`` (float64) of every position."""
    out = {}
    for i, (h, a, m, h_out) in enumerate(updates(hf, arch, tokens, mask)):
        out[i, "attn"], out[i, "mlp"], out[i, "layer"] = a, m, h_out - h
    return out


def resample_donors(masks, seed: int) -> list:
    """Per batch (in order) the row whose update replaces each position's, written from the
    documented rule: one generator seeded once; per batch a random permutation drawn until
    it moves every row (each row's donor); where the donor is padding, another row real
    there drawn uniformly (positions in row-major order); padding keeps its own row."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for mask in masks:
        valid = mask.bool()
        n_rows, n_pos = valid.shape
        while True:
            perm = torch.randperm(n_rows, generator=generator)
            if all(int(perm[b]) != b for b in range(n_rows)):
                break
        rows = torch.empty(n_rows, n_pos, dtype=torch.long)
        for b in range(n_rows):
            for t in range(n_pos):
                if not valid[b, t]:
                    rows[b, t] = b
                elif valid[int(perm[b]), t]:
                    rows[b, t] = int(perm[b])
                else:
                    others = [c for c in range(n_rows) if c != b and valid[c, t]]
                    pick = int(torch.randint(len(others), (1,), generator=generator))
                    rows[b, t] = others[pick]
        out.append(rows)
    return out


def replacement_value(kind: str, table: dict, key, rows=None):
    """The update that replaces ``key`` = (layer, part): the mean ``table[key]`` ([d]) or,
    per position (b, t), ``table[key][rows[b, t], t]`` (resample)."""
    if kind == "mean":
        return table[key]
    update = table[key]
    out = torch.empty_like(update)
    for b in range(update.shape[0]):
        for t in range(update.shape[1]):
            out[b, t] = update[int(rows[b, t]), t]
    return out


def _placed(new, old, at):
    """``new`` where the bool ``[B, T]`` mask ``at`` holds (everywhere when None)."""
    return new if at is None else torch.where(at[..., None], new, old)


@contextmanager
def block_replaced(blocks, layer: int, value, at=None):
    """Block ``layer``'s output := its input + ``value`` (at the positions in ``at``)."""

    def hook(mod, args, kwargs, output):
        h = args[0] if args else kwargs["hidden_states"]
        old = output[0] if isinstance(output, tuple) else output
        new = _placed(h + value.to(h.dtype).expand_as(h), old, at)
        return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    handle = blocks[layer].register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def sublayer_replaced(hf, arch: str, layer: int, sublayer: str, value, at=None):
    """One sublayer's update := ``value`` (at the positions in ``at``), with a plain torch
    hook: the module's output in pre-norm blocks; in encoders the stream entering the
    attention (or the MLP's add-norm) plus ``value``."""
    block = hf_blocks(hf)[layer]
    if arch in POST_LN:  # --- paper architecture: the LayerNorm's output := base + value ---

        def make(base, old):
            return _placed(base + value.to(base.dtype).expand_as(base), old, at)

        with post_ln_replaced(block, sublayer, make):
            yield
        return
    if arch in ENCODERS:
        module = block.attention if sublayer == "attn" else block.output

        def hook(mod, args, kwargs, output):
            if sublayer == "attn":
                base = args[0] if args else kwargs["hidden_states"]
            else:
                base = args[1] if len(args) > 1 else kwargs["input_tensor"]
            old = output[0] if isinstance(output, tuple) else output
            new = _placed(base + value.to(base.dtype).expand_as(base), old, at)
            return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new
    else:
        module = sublayer_modules(block, arch)[sublayer]

        def hook(mod, args, kwargs, output):
            old = output[0] if isinstance(output, tuple) else output
            new = _placed(value.to(old.dtype).expand_as(old), old, at)
            return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


# --- end of the ablation kinds block -----------------------------------------------------------

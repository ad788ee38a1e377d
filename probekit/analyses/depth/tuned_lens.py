"""Tuned lens (Belrose et al. 2023): decode every layer through a learned affine translator.

The logit lens reads the residual after d blocks with the model's own head; early residuals
live in a different basis than the final one, so it is biased there. The tuned lens gives each
depth d = 0 .. L-1 a translator ``T_d(h) = h + A_d h + b_d`` (an ``nn.Linear`` initialised at
zero, so the untrained lens *is* the logit lens) and trains it, the model frozen, so that
``head(T_d(h_d))`` matches the model's final distribution: the loss is KL(p_final || p_d)
averaged over the real (non-padding) tokens, summed over depths. Depth L (the final residual)
needs no translator. All translators are trained at once from one traced forward per batch
(every block's input residual is in :meth:`probekit.model.Model.trace`), so memory is bounded
by one batch of residuals; gradients are taken with ``torch.autograd.grad`` with respect to the
translators only, so the model's ``requires_grad`` flags and ``.grad`` are never touched.

:func:`tuned_lens` measures a fitted lens exactly like :func:`~probekit.analyses.depth.lens.
logit_lens` (same ``df`` columns, the same summary keys and figure), plus the top-1 agreement
with the final prediction and KL(p_final || p_d), the fitted objective. Fit on one split and
evaluate on another: the result records both data sets and how many evaluated sequences the
lens was fit on. :func:`compare_lenses` overlays logit- and tuned-lens results in one figure.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> model = toy_model(n_layers=2)
    >>> lens = TunedLens.fit(model, toy_tokens(seed=1), steps=3, progress=False)
    >>> res = tuned_lens(model, toy_tokens(seed=2), lens=lens)
    >>> int(res.df.depth.max()), res.summary["k"], res.meta["overlap_sequences"]
    (2, 5, 0)
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from torch import nn

from probekit import figures
from probekit.analyses.common import TokenMeans, check_outputs_finite, result_meta
from probekit.analyses.depth.lens import LogitLensResult, lens_measures
from probekit.analyses.depth.lens_checks import (
    CONFIG_FILE,
    FORMAT,
    VERSION,
    WEIGHTS_FILE,
    check_fit_sequences,
    check_identity,
    check_lens_shape,
    check_translators_finite,
    model_identity,
    read_lens_config,
    read_lens_tensors,
)
from probekit.data import Batch, Data, position_mask
from probekit.errors import CheckpointError, InputError, UnsupportedModelError
from probekit.io import atomic_write_text, swapped_directory
from probekit.model import Model, Trace, load
from probekit.result import json_ready
from probekit.words import AXES, figure_words

OPTIMIZERS = ("sgd", "adam")
"""``sgd``: SGD with Nesterov momentum (the paper's choice, the default); ``adam``: Adam with
AMSGrad, as in the ``tuned-lens`` package."""

DEFAULT_LR = {"sgd": 0.1, "adam": 1e-3}
"""Default torch learning rates. SGD's 0.1 is the package's ``lr_scale = 1`` times
``1 - momentum`` (which undoes the 1 / (1 - momentum) gain of PyTorch's momentum)."""


@dataclass
class FitSettings:
    """How a lens was trained (written to its config.json)."""

    steps: int
    lr: float
    optimizer: str
    momentum: float
    weight_decay: float
    warmup_steps: int
    grad_clip: float | None
    seed: int
    batch_size: int | None


def _check_positive(name: str, value: Any, integer: bool = False) -> None:
    kind = numbers.Integral if integer else numbers.Real
    ok = not isinstance(value, bool) and isinstance(value, kind)
    if not ok or not math.isfinite(value) or value <= 0:
        wanted = "a positive integer" if integer else "a positive finite number"
        raise InputError(f"{name}={value!r} is not {wanted}", fix=f"pass {name} > 0")


def _check_settings(s: FitSettings, tokens: int | None) -> None:
    """Raise :class:`InputError` on settings that cannot train, before any work is done."""
    _check_positive("steps", s.steps, integer=True)
    _check_positive("lr", s.lr)
    if tokens is not None:
        _check_positive("tokens", tokens, integer=True)
    if s.batch_size is not None:
        _check_positive("batch_size", s.batch_size, integer=True)
    if s.grad_clip is not None:
        _check_positive("grad_clip", s.grad_clip)
    if s.optimizer not in OPTIMIZERS:
        raise InputError(f"unknown optimizer {s.optimizer!r}", fix=f"use one of {OPTIMIZERS}")
    if not (isinstance(s.momentum, int | float) and 0 <= s.momentum < 1):
        raise InputError(f"momentum={s.momentum!r} is outside [0, 1)", fix="use e.g. 0.9")
    if not (isinstance(s.weight_decay, int | float) and 0 <= s.weight_decay < math.inf):
        raise InputError(f"weight_decay={s.weight_decay!r} is negative", fix="use e.g. 1e-3")
    if isinstance(s.seed, bool) or not isinstance(s.seed, numbers.Integral):
        raise InputError(f"seed={s.seed!r} is not an integer", fix="pass e.g. seed=0")
    if not (isinstance(s.warmup_steps, numbers.Integral) and 0 <= s.warmup_steps < s.steps):
        raise InputError(
            f"warmup_steps={s.warmup_steps!r} is not in 0..steps-1 ({s.steps - 1})",
            fix="use fewer warm-up steps than steps",
        )


def _plain(s: FitSettings) -> FitSettings:
    """The checked settings as plain Python numbers (numpy scalars become int / float)."""
    maybe = lambda x, kind: None if x is None else kind(x)  # noqa: E731
    return FitSettings(
        steps=int(s.steps),
        lr=float(s.lr),
        optimizer=s.optimizer,
        momentum=float(s.momentum),
        weight_decay=float(s.weight_decay),
        warmup_steps=int(s.warmup_steps),
        grad_clip=maybe(s.grad_clip, float),
        seed=int(s.seed),
        batch_size=maybe(s.batch_size, int),
    )


def lr_factor(step: int, steps: int, warmup_steps: int) -> float:
    """Learning-rate multiplier at 0-based ``step``: linear warm-up to 1 over ``warmup_steps``
    steps, then linear decay to ``1 / (steps - warmup_steps)`` at the last step.

    Example:
        >>> [lr_factor(s, 4, 0) for s in range(4)]
        [1.0, 0.75, 0.5, 0.25]
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return (steps - step) / (steps - warmup_steps)


def sequence_hashes(batches: list[Batch]) -> torch.Tensor:
    """One int64 hash per sequence of its real tokens (to tell fit data from evaluation data)."""
    out = []
    for batch in batches:
        tokens, valid = batch.tokens.cpu().long(), batch.valid.cpu()
        for row, keep in zip(tokens, valid, strict=True):
            digest = hashlib.blake2b(row[keep].numpy().tobytes(), digest_size=8).digest()
            out.append(int.from_bytes(digest, "little", signed=True))
    return torch.tensor(out, dtype=torch.int64)


def data_record(batches: list[Batch], hashes: torch.Tensor, label: str | None) -> dict:
    """What the result and the lens's config record about a data set."""
    fingerprint = hashlib.sha256(hashes.sort().values.numpy().tobytes()).hexdigest()[:16]
    return {
        "label": label,
        "n_sequences": len(hashes),
        "n_tokens": sum(int(b.valid.sum()) for b in batches),
        "fingerprint": fingerprint,
    }


def check_head(model: Model) -> None:
    """Refuse a model without an output head (nothing to decode the residual with): its head
    must map one residual to ``d_vocab`` logits; :class:`UnsupportedModelError` otherwise.

    Example:
        >>> from probekit.toy import toy_model
        >>> check_head(toy_model(n_layers=2))  # a language model: its head decodes
    """
    if getattr(model, "headless", None) is not None:  # loaded without its LM head
        model.require_vocabulary("the tuned lens")
    probe = torch.zeros(1, 1, model.d_model, device=model.device, dtype=model.dtype)
    try:
        with torch.no_grad():
            shape = tuple(model.head(probe).shape)
    except (AttributeError, TypeError, RuntimeError, ValueError):
        shape = None
    if model.d_vocab < 1 or shape != (1, 1, model.d_vocab):
        raise UnsupportedModelError(
            f"the {model.architecture} model has no unembedding (no vocabulary to decode to)",
            fix="load the model with its language-model head (e.g. *ForCausalLM)",
        )


class TunedLens(nn.Module):
    """One affine translator per depth 0 .. n_layers-1 (``translators[d]``, an ``nn.Linear``
    ``d_model -> d_model``); ``T_d(h) = h + translators[d](h)``.

    Build with :meth:`fit` (or :meth:`zeros`: the untrained lens, which is the logit lens);
    :meth:`save` / :meth:`load` write and read a folder (safetensors + config.json).
    ``fit_info`` records the model, the settings, the data and the loss per depth.

    Example:
        >>> from probekit.toy import toy_model
        >>> lens = TunedLens.zeros(toy_model(n_layers=3))
        >>> len(lens.translators), float(lens.translators[0].weight.detach().abs().sum())
        (3, 0.0)
    """

    def __init__(self, n_layers: int, d_model: int, d_vocab: int | None = None) -> None:
        super().__init__()
        self.n_layers, self.d_model, self.d_vocab = int(n_layers), int(d_model), d_vocab
        translators = [nn.Linear(d_model, d_model) for _ in range(n_layers)]
        with torch.no_grad():
            for t in translators:
                t.weight.zero_()
                t.bias.zero_()
        self.translators = nn.ModuleList(translators)
        self.fit_info: dict[str, Any] = {}
        self.fit_sequences = torch.zeros(0, dtype=torch.int64)

    @classmethod
    def zeros(cls, model: Model) -> TunedLens:
        """The untrained lens of ``model`` (all translators zero: exactly the logit lens)."""
        model = load(model)
        check_head(model)
        lens = cls(model.n_layers, model.d_model, model.d_vocab).to(model.device)
        lens.fit_info = {"model": repr(model), "architecture": model.architecture}
        lens.identify(model)
        return lens

    def identify(self, model: Model) -> TunedLens:
        """Record ``model`` as the model this lens belongs to (:func:`model_identity`; done by
        :meth:`zeros` and :meth:`fit`). Call it only on a lens you know was fit on ``model``:
        a lens saved before lenses recorded their model (version 1), or before they
        fingerprinted every tensor (version 2), is refused by :meth:`check_model` until
        then (``lens = TunedLens.load(path); lens.identify(model); lens.save(path)``)."""
        model = load(model)
        self.check_shape(model)
        self.fit_info["model_identity"] = model_identity(model)
        return self

    def transform(self, depth: int, residual: torch.Tensor) -> torch.Tensor:
        """``T_depth(residual)`` in float32 (the final residual, depth n_layers, unchanged)."""
        h = residual.float()
        if depth == self.n_layers:
            return h
        return h + self.translators[depth](h)

    def logits(self, model: Model, depth: int, residual: torch.Tensor) -> torch.Tensor:
        """The lens's logits at ``depth`` for ``residual`` ``[..., d_model]``."""
        return model.head(self.transform(depth, residual).to(model.dtype))

    def check_model(self, model: Model, where: str = "") -> None:
        """Refuse to read ``model`` through this lens unless it is the model the lens was fit
        on: :class:`InputError` for another shape (:meth:`check_shape`), another architecture
        or other weights in any tensor (:func:`identity_mismatch`), and for a lens that records
        no model (version 1) or a fingerprint of only some tensors (version 2): refused rather
        than trusted, see :meth:`identify`;
        :class:`NumericalError` for a NaN or infinite translator; :class:`CheckpointError` for
        ``fit_sequences`` that are not int64 hashes. ``where`` names the lens's folder."""
        self.check_shape(model)
        where = where or "in memory"
        check_translators_finite(self.state_dict(), where)
        check_fit_sequences(self.fit_sequences, where)
        check_identity(self.fit_info.get("model_identity"), model_identity(model), where)

    def check_shape(self, model: Model) -> None:
        """Raise :class:`InputError` unless ``model`` has this lens's shape."""
        check_lens_shape((self.n_layers, self.d_model, self.d_vocab), model)

    @classmethod
    def fit(
        cls,
        model: Model,
        data: Data,
        *,
        steps: int | None = None,
        tokens: int | None = None,
        lr: float | None = None,
        batch_size: int | None = None,
        optimizer: str = "sgd",
        momentum: float = 0.9,
        weight_decay: float = 1e-3,
        warmup_steps: int = 0,
        grad_clip: float | None = 1.0,
        seed: int = 0,
        progress: bool = True,
        data_label: str | None = None,
    ) -> TunedLens:
        """Train a lens on ``data``, one optimizer step per batch of ``batch_size`` sequences.

        The length of training is ``steps`` or a token budget ``tokens`` (steps until that many
        real tokens are seen; default: one pass over the data). Batches are visited in a
        random order per pass drawn from ``seed``, so a CPU fit is deterministic. ``lr``
        defaults to :data:`DEFAULT_LR`; the rate follows :func:`lr_factor`; the gradient of
        all translators together is clipped to norm ``grad_clip``. ``data_label`` names the
        data (e.g. "train split") in the lens's record.
        """
        model = load(model)
        if steps is not None and tokens is not None:
            raise InputError("both steps and tokens were given", fix="pass one of them")
        _check_positive("steps", 1 if steps is None else steps, integer=True)
        settings = FitSettings(
            steps=1 if steps is None else steps,
            lr=DEFAULT_LR.get(optimizer, 1.0) if lr is None else lr,
            optimizer=optimizer,
            momentum=momentum,
            weight_decay=weight_decay,
            warmup_steps=warmup_steps,
            grad_clip=grad_clip,
            seed=seed,
            batch_size=batch_size,
        )
        _check_settings(settings, tokens)
        settings = _plain(settings)
        check_head(model)
        batches = model.prepare(data, settings.batch_size)
        order = batch_order(
            batches,
            settings.seed,
            steps=None if steps is None else settings.steps,
            tokens=None if tokens is None else int(tokens),
        )
        settings.steps = len(order)
        _check_settings(settings, tokens)
        lens = cls.zeros(model)
        losses = lens._train(model, batches, order, settings, progress)
        check_translators_finite(lens.state_dict(), "just fit")
        lens._record(batches, settings, losses, data_label)
        return lens

    def _record(
        self, batches: list[Batch], s: FitSettings, losses: list[list[float]], label: str | None
    ) -> None:
        """Keep what the lens was fit on: settings, data (and its sequences' hashes), losses."""
        self.fit_sequences = sequence_hashes(batches)
        self.fit_info.update(
            settings=asdict(s),
            data=data_record(batches, self.fit_sequences, label),
            final_loss=losses[-1],
            loss_history=[sum(x) for x in losses],
        )

    def _train(
        self,
        model: Model,
        batches: list[Batch],
        order: list[int],
        s: FitSettings,
        progress: bool,
    ) -> list[list[float]]:
        """The training loop; returns the per-depth losses of every step."""
        from probekit.progress import bar

        opt = make_optimizer(list(self.parameters()), s)
        losses = []
        for step, index in enumerate(bar(order, desc="tuned lens", disable=not progress)):
            for group in opt.param_groups:
                group["lr"] = s.lr * lr_factor(step, s.steps, s.warmup_steps)
            trace = model.trace(batches[index])
            check_outputs_finite(trace.logits)
            losses.append(self.accumulate_grads(model, trace, trace.batch.valid))
            if s.grad_clip is not None:
                nn.utils.clip_grad_norm_(self.parameters(), s.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return losses

    def accumulate_grads(
        self, model: Model, trace: Trace, mask: torch.Tensor, depths: list[int] | None = None
    ) -> list[float]:
        """Add to each translator's ``.grad`` the gradient of its loss, the mean over the
        ``mask`` tokens of KL(p_final || p_d); returns the losses. The model gets no gradient."""
        target = trace.logits[mask].float().log_softmax(-1)[None]
        out = []
        for depth in range(self.n_layers) if depths is None else depths:
            loss = translator_loss(self, model, depth, trace.residuals[depth][mask][None], target)
            params = list(self.translators[depth].parameters())
            for p, g in zip(params, torch.autograd.grad(loss, params), strict=True):
                p.grad = g if p.grad is None else p.grad + g
            out.append(float(loss.detach()))
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write the lens to the folder ``path`` (``lens.safetensors`` + ``config.json``),
        replacing what was there as a whole; :meth:`load` reads it back."""
        from safetensors.torch import save_file

        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        tensors["fit_sequences"] = self.fit_sequences.cpu().contiguous()
        config = {
            "format": FORMAT,
            "version": VERSION,
            "n_layers": self.n_layers,
            "d_model": self.d_model,
            "d_vocab": self.d_vocab,
            "fit_info": self.fit_info,
        }
        with swapped_directory(path) as tmp:
            save_file(tensors, str(tmp / WEIGHTS_FILE))
            atomic_write_text(tmp / CONFIG_FILE, json.dumps(json_ready(config), indent=1))
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike, model: Model | None = None) -> TunedLens:
        """Read a lens written by :meth:`save` (never unpickles). Before anything is built,
        the folder's files are checked: regular files (a pipe would block), a config of the
        format whose shapes fit the weights file and the free memory, ``fit_info`` an object,
        ``fit_sequences`` int64 hashes, every translator finite. With ``model``, the config's
        shapes are compared with it first and the lens is refused unless it was fit on that
        model (:meth:`check_model`); it is then put on the model's device."""
        path = Path(path)
        config = read_lens_config(path)
        if model is not None:
            model = load(model)
            check_lens_shape((config["n_layers"], config["d_model"], config["d_vocab"]), model)
        tensors = read_lens_tensors(path, config)
        lens = cls(config["n_layers"], config["d_model"], config["d_vocab"])
        lens.fit_sequences = tensors.pop("fit_sequences", torch.zeros(0, dtype=torch.int64))
        expected = {k: tuple(v.shape) for k, v in lens.state_dict().items()}
        found = {k: tuple(v.shape) for k, v in tensors.items()}
        if expected != found:
            raise CheckpointError(
                f"{path} holds tensors {found}, not the {config['n_layers']} translators of "
                f"d_model {config['d_model']} its config declares",
                fix="re-save the lens with TunedLens.save()",
            )
        lens.load_state_dict(tensors)
        lens.fit_info = config["fit_info"]
        if model is not None:
            lens.check_model(model, where=f"in {path}")
            lens.to(model.device)
        return lens

    @classmethod
    def from_tuned_lens(
        cls, path: str | os.PathLike, model: Model, *, check_name: bool = True
    ) -> TunedLens:
        """Read a lens saved by the ``tuned-lens`` package (its folder of ``config.json`` and
        ``params.pt``, 0.1 or later; :mod:`~probekit.analyses.depth.tuned_lens_files`) for
        ``model``. Its translator of layer ``i`` reads ``hidden_states[i]``, the input of
        block ``i``: it becomes ``translators[i]`` here, so the lens gives the package's
        logits at every depth. Checked before anything is built: the config, then that the
        lens was made for ``model`` (its ``num_hidden_layers`` and ``d_model``, the
        unembedding hash the package records and, with ``check_name``, the model name:
        :class:`InputError` naming the difference), then the tensors: read with
        ``torch.load(weights_only=True)``, which never runs what a pickle holds (or from a
        ``params.safetensors`` copy), exactly the package's keys, each of its shape, a
        floating dtype and finite (:class:`CheckpointError`). The lens then records ``model``
        (:meth:`identify`), so :meth:`save` writes it in probekit's format.

        Example:
            >>> import json, tempfile, pathlib
            >>> from probekit.analyses.depth.tuned_lens_files import model_unembedding_hash
            >>> from probekit.toy import toy_model
            >>> model, folder = toy_model(n_layers=2), pathlib.Path(tempfile.mkdtemp())
            >>> config = {"base_model_name_or_path": "", "d_model": 32, "num_hidden_layers": 2,
            ...           "unembed_hash": model_unembedding_hash(model)}  # as the package writes
            >>> _ = (folder / "config.json").write_text(json.dumps(config))
            >>> params = {f"{i}.weight": torch.zeros(32, 32) for i in range(2)}
            >>> params |= {f"{i}.bias": torch.zeros(32) for i in range(2)}
            >>> torch.save(params, folder / "params.pt")
            >>> lens = TunedLens.from_tuned_lens(folder, model)
            >>> len(lens.translators), lens.fit_info["source"]
            (2, 'tuned-lens package')
        """
        from probekit.analyses.depth import tuned_lens_files as files

        path = Path(path)
        config = files.read_package_config(path)
        model = load(model)
        check_head(model)
        files.check_package_identity(config, model, path, check_name=check_name)
        tensors = files.read_package_translators(path, config)
        lens = cls(model.n_layers, model.d_model, model.d_vocab)
        lens.load_state_dict(tensors)
        lens.fit_info = {
            "source": "tuned-lens package",
            "path": str(path),
            "tuned_lens_config": config,
            "model": repr(model),
            "architecture": model.architecture,
        }
        return lens.identify(model).to(model.device)


def translator_loss(
    lens: TunedLens, model: Model, depth: int, residual: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """Mean over tokens of KL(p_final || p_depth); ``target`` holds log p_final ``[1, N, V]``."""
    logq = lens.logits(model, depth, residual).float().log_softmax(-1)
    return (target.exp() * (target - logq)).sum(-1).mean()


def make_optimizer(params: list[nn.Parameter], s: FitSettings) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum, or Adam with AMSGrad (the ``tuned-lens`` package's)."""
    if s.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=s.lr,
            momentum=s.momentum,
            nesterov=s.momentum > 0,
            weight_decay=s.weight_decay,
        )
    return torch.optim.Adam(
        params, lr=s.lr, betas=(s.momentum, 0.999), weight_decay=s.weight_decay, amsgrad=True
    )


def batch_order(
    batches: list[Batch], seed: int, *, steps: int | None = None, tokens: int | None = None
) -> list[int]:
    """The batch index of every step: passes over the data, each in an order drawn from
    ``seed``; ``steps`` of them, or until ``tokens`` real tokens, or one pass.

    Example:
        >>> from probekit.data import as_batches
        >>> batch_order(as_batches(torch.ones(4, 3, dtype=torch.long), 1), 0, tokens=7)
        [0, 1, 3]
    """
    g = torch.Generator().manual_seed(seed)
    sizes = [int(b.valid.sum()) for b in batches]
    order: list[int] = []
    seen = 0
    while True:
        for i in torch.randperm(len(batches), generator=g).tolist():
            done = (
                len(order) >= steps
                if steps is not None
                else seen >= tokens
                if tokens is not None
                else len(order) == len(batches)
            )
            if done:
                return order
            order.append(i)
            seen += sizes[i]


LENS_MEASURES = ("kl", "topk_overlap", "top1_agreement", "kl_final_first")
"""Per token, averaged over the selected positions: ``kl`` = KL(p_d || p_final) and
``topk_overlap`` as in the logit lens; ``top1_agreement`` = 1 where the lens's top-1 token is
the model's; ``kl_final_first`` = KL(p_final || p_d), the objective the lens is fit on."""


class TunedLensResult(LogitLensResult):
    """A :class:`~probekit.analyses.depth.lens.LogitLensResult` of the tuned lens.

    ``df`` columns: ``depth``, ``measure`` (:data:`LENS_MEASURES`), ``value``. ``summary``: the
    logit lens's keys (``k``, ``kl_threshold``, ``formed_at_depth``, ``mean_kl_second_half``,
    ``n_layers``) plus ``agreement_threshold``, ``top1_formed_at_depth`` (first depth whose
    top-1 agrees with the final one on at least that share of the tokens) and ``mean_kl``
    (mean of ``kl`` over depths 0 .. L-1). ``meta``: ``fit_data`` / ``eval_data`` (label,
    sequences, tokens, fingerprint), ``overlap_sequences`` (evaluated sequences the lens was
    fit on), ``fit_settings``.
    """

    kind = "tuned_lens"
    title = figure_words("tuned_lens")

    def profile(self, measure: str = "kl") -> pd.Series:
        """One measure per depth, indexed by depth."""
        if measure not in set(self.df.measure):
            raise InputError(f"unknown measure {measure!r}", fix=f"use one of {LENS_MEASURES}")
        part = self.df[self.df.measure == measure]
        return part.set_index("depth")["value"].sort_index()

    def kl_per_layer(self, direction: str = "lens_first") -> pd.Series:
        """Mean KL per depth: ``"lens_first"`` KL(p_d || p_final) (the logit lens's ``kl``)
        or ``"final_first"`` KL(p_final || p_d) (the fitted objective)."""
        if direction not in ("lens_first", "final_first"):
            raise InputError(f"unknown direction {direction!r}", fix="'lens_first'/'final_first'")
        return self.profile("kl" if direction == "lens_first" else "kl_final_first")

    def figure(self) -> go.Figure:
        fig = super().figure()
        fig.update_layout(title={"text": self.title})
        return fig


def lens_summary(df: pd.DataFrame, n_layers: int, k: int, kl_threshold: float) -> dict:
    """The logit lens's summary keys, computed from a lens ``df`` the way ``logit_lens`` does."""
    kl = df[df.measure == "kl"].set_index("depth")["value"]
    formed = kl[kl < kl_threshold]
    half = (n_layers + 1) // 2
    second = kl[(kl.index > half) & (kl.index < n_layers)]
    return {
        "k": k,
        "kl_threshold": kl_threshold,
        "formed_at_depth": int(formed.index.min()) if len(formed) else n_layers,
        "mean_kl_second_half": float(second.mean()) if n_layers - half > 1 else float("nan"),
        "n_layers": n_layers,
    }


def first_agreeing_depth(df: pd.DataFrame, n_layers: int, threshold: float = 0.5) -> int:
    """First depth whose ``top1_agreement`` is at least ``threshold`` (n_layers at worst)."""
    agree = df[df.measure == "top1_agreement"].set_index("depth")["value"].sort_index()
    hits = agree[agree >= threshold]
    return int(hits.index.min()) if len(hits) else n_layers


def _measure_batch(
    acc: TokenMeans, lens: TunedLens, model: Model, trace: Trace, mask: torch.Tensor, k: int
) -> None:
    final = trace.logits
    logp_final = final.double().log_softmax(-1)
    for depth, residual in enumerate(trace.residuals):
        logits = lens.logits(model, depth, residual)
        measures = lens_measures(logits, final, k)
        measures["top1_agreement"] = (logits.argmax(-1) == final.argmax(-1)).double()
        logq = logits.double().log_softmax(-1)
        measures["kl_final_first"] = (logp_final.exp() * (logp_final - logq)).sum(-1)
        for name, values in measures.items():
            acc.add((depth, name), values, mask)


def is_package_lens(path: str | os.PathLike) -> bool:
    """Whether the folder ``path`` holds a lens of the ``tuned-lens`` package (its
    ``params.pt`` or a ``params.safetensors`` copy, and no probekit weights file)."""
    from probekit.analyses.depth import tuned_lens_files as files

    folder = Path(path)
    found = any(os.path.lexists(folder / f) for f in (files.PARAMS_FILE, files.SAFETENSORS_FILE))
    return found and not os.path.lexists(folder / WEIGHTS_FILE)


def as_lens(lens: TunedLens | str | os.PathLike, model: Model) -> TunedLens:
    """``lens`` (a :class:`TunedLens`, its folder, or the folder of a ``tuned-lens`` package
    lens: :meth:`TunedLens.from_tuned_lens`) checked against ``model``
    (:meth:`TunedLens.check_model`) and put on its device."""
    if isinstance(lens, str | os.PathLike):
        if is_package_lens(lens):
            return TunedLens.from_tuned_lens(lens, model)
        return TunedLens.load(lens, model)
    if not isinstance(lens, TunedLens):
        raise InputError(
            f"lens is a {type(lens).__name__}, not a TunedLens",
            fix="pass TunedLens.fit(model, data) or the folder of a saved lens",
        )
    lens.check_model(model)
    return lens.to(model.device)


@torch.no_grad()
def tuned_lens(
    model: Model,
    data: Data,
    *,
    lens: TunedLens | str | os.PathLike,
    k: int = 5,
    positions: str = "all",
    kl_threshold: float = 0.1,
    agreement_threshold: float = 0.5,
    batch_size: int | None = None,
    data_label: str | None = None,
) -> TunedLensResult:
    """Decode every depth through ``lens`` (a :class:`TunedLens` or its saved folder) and
    compare with the final output; ``data`` should be held out from the data it was fit on.

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> model = toy_model(n_layers=2)
        >>> res = tuned_lens(model, toy_tokens(), lens=TunedLens.zeros(model))  # = logit lens
        >>> res.summary["top1_formed_at_depth"] <= 2, res.kl_per_layer().index.tolist()
        (True, [0, 1, 2])
    """
    model = load(model)
    model.require_vocabulary("the tuned lens")
    lens = as_lens(lens, model)
    if not 1 <= k <= model.d_vocab:
        raise InputError(f"k={k} is outside 1..{model.d_vocab}", fix="pick k <= vocabulary size")
    acc = TokenMeans()
    batches = model.prepare(data, batch_size)
    for batch in batches:
        trace = model.trace(batch)
        check_outputs_finite(trace.logits)
        _measure_batch(acc, lens, model, trace, position_mask(batch, positions), k)
    depths = range(model.n_layers + 1)
    rows = [
        {"depth": d, "measure": m, "value": acc.mean((d, m))} for d in depths for m in LENS_MEASURES
    ]
    df = pd.DataFrame(rows)
    summary = lens_summary(df, model.n_layers, k, kl_threshold)
    kl = df[(df.measure == "kl") & (df.depth < model.n_layers)].value
    summary.update(
        agreement_threshold=agreement_threshold,
        top1_formed_at_depth=first_agreeing_depth(df, model.n_layers, agreement_threshold),
        mean_kl=float(kl.mean()),
    )
    hashes = sequence_hashes(batches)
    meta = result_meta(model, positions=positions, batch_size=batch_size)
    meta |= {
        "fit_data": lens.fit_info.get("data"),
        "fit_settings": lens.fit_info.get("settings"),
        "eval_data": data_record(batches, hashes, data_label),
        "overlap_sequences": int(torch.isin(hashes, lens.fit_sequences.cpu()).sum()),
    }
    return TunedLensResult(df, summary, meta)


def compare_lenses(*results: LogitLensResult, names: list[str] | None = None) -> go.Figure:
    """Overlay lens results (logit and tuned lens, several models, ...) in one figure: mean
    KL(p_d || p_final) per depth on the left axis, top-k overlap (dotted) on the right.

    Example:
        >>> from probekit.analyses.depth.lens import logit_lens
        >>> from probekit.toy import toy_model, toy_tokens
        >>> model = toy_model(n_layers=2)
        >>> plain = logit_lens(model, toy_tokens())
        >>> tuned = tuned_lens(model, toy_tokens(), lens=TunedLens.zeros(model))
        >>> len(compare_lenses(plain, tuned).data)
        4
    """
    from plotly.subplots import make_subplots

    names = names or [r.kind.replace("_", " ") for r in results]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for i, (res, name) in enumerate(zip(results, names, strict=True)):
        color = figures.PALETTE[i % len(figures.PALETTE)]
        for measure, dash, secondary in (("kl", None, False), ("topk_overlap", "dot", True)):
            part = res.df[res.df.measure == measure].sort_values("depth")
            which = "kl" if measure == "kl" else "overlap"
            label = figure_words("compare_lenses", which, name=name, k=res.summary["k"])
            fig.add_trace(
                go.Scatter(
                    x=part.depth,
                    y=part.value,
                    name=label,
                    mode="lines+markers",
                    line={"color": color, "dash": dash},
                ),
                secondary_y=secondary,
            )
    fig.update_yaxes(title_text=figure_words("compare_lenses", "y"), secondary_y=False)
    figures.overlap_axis(fig)
    fig.update_xaxes(title_text=AXES["depth"])
    depth = max(int(r.df.depth.max()) for r in results)
    figures.integer_axis(fig, "x", n=depth + 1)
    return figures.base_layout(fig, figure_words("compare_lenses"))

"""An LM run's settings: :class:`LMConfig`, the shared run settings plus the model, the
growth schedule and the corpus, checked before anything is read or built.

Example:
    >>> cfg = LMConfig(n_layers=4, initial_layers=2, block_size=2, growth="midas", steps=100)
    >>> cfg.validate()
    >>> cfg.plan().depths
    [2, 4]
    >>> LMConfig(d_model=10, n_heads=4).validate()
    Traceback (most recent call last):
    ...
    probekit.errors.ConfigError: d_model 10 is not divisible by n_heads 4. Fix: ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from probekit.errors import ConfigError
from probekit.lm.corpus import BOS, EOS, VOCAB_SIZE
from probekit.training.checks import (
    DEPTH_WHY,
    MAX_LAYERS,
    check_bounded,
    check_flag,
    check_int,
    check_optional_int,
    check_real,
    check_str,
)
from probekit.training.growth import METHODS, growth_plan
from probekit.training.loop import RunSettings
from probekit.training.models import gpt2_config

#: LMConfig's own settings that must be positive integers
_POSITIVE = (
    "n_layers",
    "d_model",
    "n_heads",
    "seq_len",
    "eval_sequences",
    "initial_layers",
    "block_size",
    "residual_scale_steps",
)


@dataclass
class LMConfig(RunSettings):
    """A language-model run: the shared run settings
    (:class:`~probekit.training.loop.RunSettings`: seed, steps, batch size, the AdamW schedule,
    ``eval_every``, precision, determinism; an LM run's defaults are set here) and the model,
    growth and corpus. ``n_layers`` is the final depth; grown runs start at ``initial_layers``
    and add ``block_size`` layers per stage. ``corpus_root`` is a folder of ``.py`` files
    (default: the Python standard library). ``layernorm_scaling``: LayerNorm Scaling (Sun et
    al. 2025), static runs only."""

    n_layers: int = 8
    d_model: int = 128
    n_heads: int = 4
    d_mlp: int | None = None
    seq_len: int = 128
    # an LM run's defaults of shared run settings
    batch_size: int = 32
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    eval_every: int = 200
    growth: str = "static"
    initial_layers: int = 2
    block_size: int = 2
    alpha: float = 1.0
    residual_scale_start: float | None = None
    residual_scale_steps: int = 200
    eval_sequences: int = 64
    corpus_root: str | None = None
    corpus_max_files: int | None = None
    save_every: int | None = None
    layernorm_scaling: bool = False

    EXAMPLES: ClassVar[dict[str, str]] = {
        "weight_decay": "0 or e.g. 0.1",
        "min_lr_ratio": "e.g. 0.1",
    }

    def validate(self) -> None:
        """Raise :class:`ConfigError` on settings that cannot be trained (types, ranges,
        finiteness, the growth schedule), before anything is read or built."""
        if not isinstance(self.growth, str) or self.growth not in ("static",) + METHODS:
            raise ConfigError(
                f"unknown growth {self.growth!r}", fix=f"use 'static' or one of {list(METHODS)}"
            )
        for name in _POSITIVE:
            check_int(name, getattr(self, name))
        check_bounded("n_layers", self.n_layers, MAX_LAYERS, DEPTH_WHY)
        self.validate_run()
        for name in ("d_mlp", "save_every", "corpus_max_files"):
            check_optional_int(name, getattr(self, name))
        check_str("corpus_root", self.corpus_root, optional=True)
        check_real("alpha", self.alpha, positive=True, example="e.g. 1.0 (Prop-1)")
        if self.residual_scale_start is not None:
            check_real("residual_scale_start", self.residual_scale_start, 0, 1, example="e.g. 0.1")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}",
                fix="choose n_heads dividing d_model",
            )
        check_flag("layernorm_scaling", self.layernorm_scaling)
        if self.layernorm_scaling and self.growth != "static":
            raise ConfigError(
                f"layernorm_scaling with growth {self.growth!r} is not supported: a copied layer "
                "would move to a depth with another LayerNorm scale",
                fix="train a static model with layernorm_scaling, or grow without it",
            )
        self.plan()

    def plan(self):
        """The growth plan (a single stage for static runs)."""
        if self.growth == "static":
            return growth_plan(self.n_layers, self.n_layers, self.steps, block_size=1)
        return growth_plan(
            self.initial_layers,
            self.n_layers,
            self.steps,
            method=self.growth,
            block_size=self.block_size,
            alpha=self.alpha,
        )

    def hf_config(self, n_layers: int):
        """The ``transformers.GPT2Config`` of this run at depth ``n_layers``."""
        return gpt2_config(
            vocab_size=VOCAB_SIZE,
            n_positions=self.seq_len,
            d_model=self.d_model,
            n_layers=n_layers,
            n_heads=self.n_heads,
            d_mlp=self.d_mlp,
            bos_token_id=BOS,
            eos_token_id=EOS,
            architectures=["GPT2LMHeadModel"],
        )


__all__ = ["LMConfig"]

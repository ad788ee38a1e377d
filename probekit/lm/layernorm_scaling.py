"""LayerNorm Scaling of an LM run (Sun et al. 2025): the gains and biases of layer ``l``
parametrised as ``1/sqrt(l)`` times the trained ones
(:func:`~probekit.training.models.layernorm_scales`), a plain Hugging Face GPT-2 that holds
the scaled values (its forward is the training forward, bit for bit), and the trained values
kept beside it in :data:`UNSCALED_LN_FILE`, read back and checked when a run resumes.

Example:
    >>> import transformers
    >>> from probekit.lm import LMConfig
    >>> config = LMConfig(n_layers=2, d_model=8, n_heads=2).hf_config(2)
    >>> model = transformers.GPT2LMHeadModel(config)
    >>> scale_layernorms(model)
    >>> plain = hf_copy(model)
    >>> sorted(unscaled_of(model))[:2]
    ['transformer.h.0.ln_1.bias', 'transformer.h.0.ln_1.weight']
    >>> round(float(plain.transformer.h[1].ln_1.weight.detach()[0]), 4)  # layer 2: 1/sqrt(2)
    0.7071
"""

from __future__ import annotations

from pathlib import Path

import torch

from probekit.errors import CheckpointError
from probekit.training.checkpoint import FIX, check_tensors
from probekit.training.models import layernorm_scales, scale_layernorm

#: the file of the unscaled LN gains and biases of a LayerNorm-Scaling LM run, in its checkpoint
UNSCALED_LN_FILE = "layernorm_scaling.safetensors"


def hf_name(name: str) -> str:
    """The HF name of a parameter (``ln_1.parametrizations.weight.original`` -> ``ln_1.weight``)."""
    return name.replace(".parametrizations.", ".").removesuffix(".original")


class _Scaled(torch.nn.Module):
    """A LayerNorm-Scaling gain or bias, parametrised: the trained tensor times 1/sqrt(l)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, unscaled: torch.Tensor) -> torch.Tensor:
        return scale_layernorm(unscaled, self.factor)


def scale_layernorms(model, unscaled: dict[str, torch.Tensor] | None = None) -> None:
    """Parametrise the layers' LN gains and biases of an HF GPT-2 as LayerNorm Scaling does;
    the trained (unscaled) values are ``unscaled`` (default: the model's current ones)."""
    from torch.nn.utils import parametrize

    modules = dict(model.named_modules())
    for name, factor in layernorm_scales(model.config.n_layer).items():
        owner, kind = name.rsplit(".", 1)
        module = modules[owner]
        if unscaled is not None:
            with torch.no_grad():
                getattr(module, kind).copy_(unscaled[name])
        parametrize.register_parametrization(module, kind, _Scaled(factor))


def hf_copy(model):
    """A plain GPT-2 holding what ``model`` computes: LayerNorm Scaling folded into the gains."""
    import transformers

    if not any(".parametrizations." in n for n, _ in model.named_parameters()):
        return model
    state = {hf_name(k): v for k, v in model.state_dict().items()}
    modules = dict(model.named_modules())
    for name in layernorm_scales(model.config.n_layer):
        owner, kind = name.rsplit(".", 1)
        state[name] = getattr(modules[owner], kind).detach()
    plain = transformers.GPT2LMHeadModel(model.config)
    plain.load_state_dict(state)
    return plain


def unscaled_of(model) -> dict[str, torch.Tensor]:
    """The trained (unscaled) LN gains and biases of a LayerNorm-Scaling model."""
    return {
        hf_name(n): p.detach().cpu().contiguous()
        for n, p in model.named_parameters()
        if ".parametrizations." in n
    }


def read_unscaled(path: Path, model) -> dict[str, torch.Tensor]:
    """The unscaled LN gains of a LayerNorm-Scaling checkpoint, checked to fold into exactly
    the gains its ``model.safetensors`` holds."""
    from safetensors.torch import load_file

    file = path / UNSCALED_LN_FILE
    try:
        unscaled = load_file(str(file))
    except Exception as err:  # safetensors raises its own error type on a damaged file
        what = "is missing" if not file.exists() else f"is corrupt or truncated ({err})"
        raise CheckpointError(f"{file} {what}", fix=FIX) from err
    scales = layernorm_scales(model.config.n_layer)
    check_tensors(file, unscaled, {k: (model.config.n_embd,) for k in scales})
    state = model.state_dict()
    bad = [
        k for k, f in scales.items() if not torch.equal(scale_layernorm(unscaled[k], f), state[k])
    ]
    if bad:
        raise CheckpointError(
            f"{file} does not fold into the LayerNorm gains of {path / 'model.safetensors'} "
            f"({', '.join(bad[:3])})",
            fix=FIX,
        )
    return unscaled


__all__ = [
    "UNSCALED_LN_FILE",
    "hf_copy",
    "hf_name",
    "read_unscaled",
    "scale_layernorms",
    "unscaled_of",
]

"""The Hugging Face block path of hook-free resumes: pure Hugging Face copies of the bridge's
blocks (sharing their weights, without TransformerLens' components) that a :class:`Trace
<probekit.model.Trace>` runs instead of the bridge's where no hook can tell the difference,
checked once per precision against the bridge's own blocks.

:class:`BlockCopies` takes the model's :class:`~probekit.model.runtime.Runtime`; its
:meth:`~BlockCopies.block_for` is the route of the model's traces, and the handle's
``block_path`` says which path hook-free block runs take now.

Example:
    >>> from probekit.toy import toy_model
    >>> model = toy_model(n_layers=2)
    >>> copies = BlockCopies(model.runtime)
    >>> copies.refusal() is None, copies.block_for(model.blocks[0]) is not None
    (True, True)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from probekit.data import Batch
from probekit.errors import UnsupportedModelError
from probekit.model.inputs import probe_batch
from probekit.model.runtime import Runtime
from probekit.model.sites import global_hooks, hook_registries
from probekit.model.trace import record_trace
from probekit.numerics import relative_deviation

RAW_BLOCKS_ENV = "PROBEKIT_RAW_BLOCKS"
"""Environment variable: ``0`` turns the Hugging Face block path of hook-free resumes off for
models loaded afterwards (the default of the handle's ``raw_blocks`` is True)."""

RAW_BLOCKS_TOLERANCE = 1e-6
"""The pure Hugging Face blocks replace the bridge's only where, on the check batches, every
block output satisfies ``max |hf - bridge| <= 1e-6 * max(1, max |bridge|)`` (float64)."""


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)
"""A module's hook registries (a pure copy starts with empty ones)."""


def _wrapped_block(block: nn.Module) -> nn.Module:
    """The Hugging Face block a bridge ``block`` wraps (its ``original_component``)."""
    inner = block.original_component
    if not isinstance(inner, nn.Module):
        raise UnsupportedModelError(
            f"a {type(block).__name__} of the bridge wraps no Hugging Face module",
            fix="nothing to do: hook-free blocks run through the bridge",
        )
    return inner


def _hf_module(module: nn.Module) -> nn.Module:
    """The Hugging Face module a TransformerLens component wraps (``module`` itself if none)."""
    while "_original_component" in module._modules:
        inner = module._modules["_original_component"]
        if inner is None:
            raise UnsupportedModelError(
                f"a {type(module).__name__} of the bridge wraps no Hugging Face module",
                fix="nothing to do: hook-free blocks run through the bridge",
            )
        module = inner
    return module


TANH_GELUS = ("NewGELUActivation", "FastGELUActivation", "AccurateGELUActivation")
"""Hugging Face activations that write the tanh approximation of GELU,
``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``, as six or seven element-wise torch
operations (GPT-2's ``gelu_new``, ``gelu_fast``, ``gelu_accurate``). The copies run torch's
one fused kernel of the same formula, ``nn.GELU(approximate="tanh")``, instead: the same
function to float32 rounding (the copy check holds it to :data:`RAW_BLOCKS_TOLERANCE`), in
one pass over the MLP's hidden layer instead of seven."""


def _fused_activation(module: nn.Module) -> nn.Module | None:
    """torch's fused tanh GELU for a Hugging Face activation of :data:`TANH_GELUS` (the
    class itself, not a subclass that may change it); None for any other module."""
    from transformers import activations

    if any(type(module) is getattr(activations, name, None) for name in TANH_GELUS):
        return nn.GELU(approximate="tanh")
    return None


def _pure_copy(module: nn.Module, memo: dict[int, nn.Module]) -> nn.Module:
    """A copy of the Hugging Face module tree under ``module`` with every TransformerLens
    component replaced by the module it wraps: each copied module shares its original's
    parameter and buffer dictionaries (the same tensors, later moves and edits included) and
    attributes, but has no hooks, no instance-level ``forward`` patch, and copied children;
    a tanh-GELU activation of :data:`TANH_GELUS` becomes torch's fused one."""
    module = _hf_module(module)
    if id(module) in memo:
        return memo[id(module)]
    fused = _fused_activation(module)
    if fused is not None:
        memo[id(module)] = fused
        return fused
    clone = type(module).__new__(type(module))  # copy.copy, also of a parametrized module
    clone.__dict__.update(module.__dict__)
    clone.__dict__.pop("forward", None)  # a patch bound to the original would run it instead
    for name in _HOOK_DICTS:
        if name in clone.__dict__:
            clone.__dict__[name] = type(module.__dict__[name])()
    memo[id(module)] = clone
    clone.__dict__["_modules"] = {
        name: None if child is None else _pure_copy(child, memo)
        for name, child in module._modules.items()
    }
    return clone


def _mirror_hooks(modules: Sequence[nn.Module]) -> int:
    """How many of the forward hooks on ``modules`` are the permanent ones TransformerLens'
    ``_wire_symbolic_hooks`` adds (they re-fire a placeholder sublayer's own hook points)."""
    return sum(
        "_wire_symbolic_hooks" in getattr(fn, "__name__", "")
        for m in modules
        for fn in m._forward_hooks.values()
    )


def _precision_key(device_type: str) -> tuple[str, bool, torch.dtype | None]:
    """The device type and its autocast state, which a block check holds for."""
    on = torch.is_autocast_enabled(device_type)
    return device_type, on, torch.get_autocast_dtype(device_type) if on else None


@dataclass
class HFBlocks:
    """Pure Hugging Face copies of a model's bridge blocks (see :class:`BlockCopies`), keyed
    by ``id`` of the bridge block (a
    reordered block list keeps each copy with its block), with each bridge block's hook
    registries for the hook test (and the hook counter at which it last found none) and the
    outcome of the per-precision checks. ``refusal`` says why there are no copies (None: there
    are)."""

    copies: dict[int, nn.Module] = field(default_factory=dict)
    watched: dict[int, list[dict]] = field(default_factory=dict)
    own_hooks: dict[int, int] = field(default_factory=dict)
    hook_free: dict[int, int] = field(default_factory=dict)
    checks: dict[tuple, str | None] = field(default_factory=dict)
    refusal: str | None = None

    @classmethod
    def build(cls, runtime: Runtime) -> HFBlocks:
        """The copies of ``runtime``'s blocks, or the reason there are none."""
        if any(hasattr(m, "_hf_hook") for m in runtime.hf_model.modules()):
            return cls(refusal="accelerate device_map / offload hooks on the model")
        out = cls()
        try:
            for block in runtime.blocks:
                out.copies[id(block)] = _pure_copy(_wrapped_block(block), {})
                out.watched[id(block)] = hook_registries(block)
                out.own_hooks[id(block)] = _mirror_hooks(list(block.modules()))
        except (UnsupportedModelError, AttributeError) as err:
            return cls(refusal=f"no pure Hugging Face copy of the blocks ({err})")
        return out

    def foreign_hooks(self, block: nn.Module) -> bool:
        """True when a hook other than the bridge's own sits in ``block``: its capture hooks
        (for hook_mlp_in and split-QKV inputs) and the permanent hooks that mirror a
        placeholder sublayer's hooks (OPT's and BERT's MLP); anything else, or fewer of
        those, reads as a hook to honour."""
        if id(block) not in self.watched:
            return True
        stamp = torch.utils.hooks.RemovableHandle.next_id  # grows with every hook registered
        if self.hook_free.get(id(block)) == stamp:
            return False
        own = len(getattr(block, "_capture_hook_handles", ())) + self.own_hooks[id(block)]
        if sum(map(len, self.watched[id(block)])) != own:
            return True
        self.hook_free[id(block)] = stamp
        return False


class BlockCopies:
    """The Hugging Face block path of a :class:`Runtime`: whether it is on (``enabled``,
    default from :data:`RAW_BLOCKS_ENV`), the copies and their checks (``hf_blocks``, built
    the first time :meth:`refusal` or :meth:`block_for` asks; None before), and the route a
    :class:`~probekit.model.Trace` takes per hook-free block (:meth:`block_for`).

    Example:
        >>> from probekit.toy import toy_model
        >>> copies = BlockCopies(toy_model(n_layers=2).runtime)
        >>> copies.enabled = False
        >>> copies.refusal()
        'Model.raw_blocks is False'
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.enabled: bool = os.environ.get(RAW_BLOCKS_ENV, "1") != "0"
        self.hf_blocks: HFBlocks | None = None

    def refusal(self, device_type: str | None = None) -> str | None:
        """Why hook-free blocks on ``device_type`` (default: the model's) do not run through
        the HF copies now (None: they do); builds the copies and runs the check of the current
        precision the first time (the handle's ``block_path`` says it in words)."""
        if not self.enabled:
            return "Model.raw_blocks is False"  # the switch as users set it, on the handle
        if self.hf_blocks is None:
            self.hf_blocks = HFBlocks.build(self.runtime)
        hf = self.hf_blocks
        if hf.refusal is not None:
            return hf.refusal
        key = _precision_key(device_type or self.runtime.device.type)
        if key not in hf.checks:
            if any(hf.foreign_hooks(block) for block in self.runtime.blocks):
                return "not checked yet (hooks are active in the blocks)"
            hf.checks[key] = _check_copies(self.runtime, hf)
        return hf.checks[key]

    def block_for(self, block: nn.Module, device_type: str | None = None) -> nn.Module | None:
        """The pure HF copy to run instead of bridge ``block`` now on ``device_type`` (the
        device of the residual; default the model's), or None (the bridge): the
        :data:`~probekit.model.trace.Route` of the model's traces. Called per block run, so
        the checked case costs a few microseconds."""
        hf = self.hf_blocks
        key = _precision_key(device_type or self.runtime.device.type)
        if hf is None or key not in hf.checks:
            if self.refusal(device_type) is not None:
                return None
            hf = self.hf_blocks
            assert hf is not None
        if not self.enabled or hf.refusal is not None or hf.checks[key] is not None:
            return None
        if block.training or global_hooks() or hf.foreign_hooks(block):
            return None
        return hf.copies.get(id(block))


@torch.no_grad()
def _check_copies(runtime: Runtime, hf: HFBlocks) -> str | None:
    """Compare every HF copy with its bridge block on the probe batch and a padded one,
    alone and stacked; None when all agree within :data:`RAW_BLOCKS_TOLERANCE`."""
    probe = probe_batch(runtime.n_ctx, runtime.d_vocab, runtime.device)
    mask = torch.ones_like(probe.tokens).repeat(2, 1)  # the probe's mask (all ones), twice
    n = mask.shape[1]
    mask[1, n - n // 2 :] = 0
    try:
        return _compare_copies(runtime, hf, [probe, Batch(probe.tokens.repeat(2, 1), mask)])
    except Exception as err:  # a call the copies (or stacked bridge blocks) cannot run
        return f"the check of the Hugging Face copies failed ({type(err).__name__}: {err})"


def _compare_copies(runtime: Runtime, hf: HFBlocks, batches: list[Batch]) -> str | None:
    """The first difference beyond :data:`RAW_BLOCKS_TOLERANCE` between a copy and its bridge
    block on ``batches`` (None: none)."""
    for batch in batches:
        trace = record_trace(runtime, batch)
        for layer, block in enumerate(runtime.blocks):
            hf_call = trace.hf_calls[layer]
            if hf_call is None:
                return f"the bridge block {layer} never called its Hugging Face block"
            h, other = trace.residuals[layer], trace.residuals[layer + 1]
            for variants in ([h], [h, other]):
                want = trace.run_module(block, trace.calls[layer], variants)
                got = trace.run_module(hf.copies[id(block)], hf_call, variants)
                worst = max(relative_deviation(g, w) for g, w in zip(got, want, strict=True))
                if not worst <= RAW_BLOCKS_TOLERANCE:  # NaN fails too
                    return (
                        f"the Hugging Face copy of block {layer} differs from the bridge's "
                        f"by {worst:.1e} (relative to max(1, max |output|)) on a probe batch"
                    )
    return None


__all__ = [
    "RAW_BLOCKS_ENV",
    "RAW_BLOCKS_TOLERANCE",
    "TANH_GELUS",
    "BlockCopies",
    "HFBlocks",
]

"""A clean forward kept for resuming: each block's input residual and the arguments the model
passed to it, so that any layer's forward can be rerun from there with a changed residual, a
changed block order, or several variants stacked along the batch dimension.

A trace holds the :class:`~probekit.model.runtime.Runtime` it ran on and a ``route``: the
module that runs a hook-free block instead of the bridge's, if any (the Hugging Face copies of
:mod:`probekit.model.hf_blocks` give it; without one, every block runs through the bridge).

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> model = toy_model(n_layers=2)
    >>> trace = record_trace(model.runtime, model.prepare(toy_tokens())[0])
    >>> len(trace.residuals)
    3
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from probekit.data import Batch
from probekit.errors import InputError, NumericalError, UnsupportedModelError
from probekit.model.inputs import check_layer_list
from probekit.model.runtime import Runtime
from probekit.model.sites import HookList, hook_name
from probekit.numerics import all_finite
from probekit.progress import advance

Route = Callable[[nn.Module, str], nn.Module | None]
"""``route(block, device_type)``: the module to run instead of the bridge's ``block`` now, on
residuals of ``device_type``, with the Hugging Face block's call; None: the bridge's block."""


def bridge_only(block: nn.Module, device_type: str) -> None:
    """The :data:`Route` of a trace whose blocks all run through the bridge."""
    return None


@dataclass
class Trace:
    """The residual stream of one clean forward, ready to resume from any layer.

    ``residuals[l]`` is the input of block ``l`` (``residuals[n_layers]`` the final residual),
    ``logits`` the clean output and ``calls[l]`` the arguments the model passed to block ``l``
    (attention mask, position embeddings, ...), replayed by :meth:`resume`; ``hf_calls[l]``
    those the bridge block passed on to the Hugging Face block inside it, replayed when a
    hook-free block runs through the module ``route`` gives (the pure Hugging Face copy: see
    the handle's ``block_path``). ``runtime`` is the model's runtime core.
    """

    runtime: Runtime
    batch: Batch
    residuals: list[torch.Tensor]
    logits: torch.Tensor
    calls: list[tuple[tuple, dict]] = field(repr=False)
    hf_calls: list[tuple[tuple, dict] | None] = field(default_factory=list, repr=False)
    route: Route = field(default=bridge_only, repr=False)

    def _route(self, layer: int) -> tuple[nn.Module, tuple[tuple, dict]]:
        """The module to run for block ``layer`` and its clean call: the module
        :attr:`route` gives, with the HF block's arguments, else the bridge's block."""
        block = self.runtime.blocks[layer]
        call = self.hf_calls[layer] if layer < len(self.hf_calls) else None
        device = self.residuals[layer].device.type
        raw = None if call is None else self.route(block, device)
        return (block, self.calls[layer]) if raw is None else (raw, call)  # type: ignore[return-value]

    def run_block(self, layer: int, residual: torch.Tensor) -> torch.Tensor:
        """Run block ``layer`` on ``residual`` with the arguments of the clean forward."""
        module, call = self._route(layer)
        return self.run_module(module, call, [residual])[0]

    def run_module(
        self, module: nn.Module, call: tuple[tuple, dict], residuals: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """``module`` run once on ``residuals`` stacked along the batch dimension with the
        clean ``call`` (its batch-sized tensors repeated); each variant's output."""
        advance(len(residuals))  # the live progress line of a command, if one is open
        args, kwargs = call if len(residuals) == 1 else self._stacked(call, len(residuals))
        stacked = residuals[0] if len(residuals) == 1 else torch.cat(list(residuals))
        if args:
            out = module(stacked, *args[1:], **kwargs)
        else:
            out = module(**{**kwargs, "hidden_states": stacked})
        out = out[0] if isinstance(out, tuple) else out
        return [out] if len(residuals) == 1 else list(out.split(residuals[0].shape[0]))

    def _stacked(self, call: tuple[tuple, dict], copies: int) -> tuple[tuple, dict]:
        """The clean ``call`` with every tensor that has the batch dimension first repeated
        ``copies`` times along it (masks, position ids, ...); BLOOM's ``alibi``, whose first
        dimension is batch x heads (batch-major), is repeated per sequence the same way."""
        size = self.batch.tokens.shape[0]

        def tile(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == size:
                return torch.cat([value] * copies)
            if isinstance(value, tuple | list):
                return type(value)(tile(v) for v in value)
            return value

        def tile_alibi(value: Any) -> Any:
            heads = self.runtime.n_heads
            if not isinstance(value, torch.Tensor) or value.shape[0] != size * heads:
                return tile(value)
            per_sequence = value.reshape(size, heads, *value.shape[1:])
            return torch.cat([per_sequence] * copies).flatten(0, 1)

        args, kwargs = call
        return tile(args), {
            key: tile_alibi(value) if key == "alibi" else tile(value)
            for key, value in kwargs.items()
        }

    def run_stacked(self, layer: int, residuals: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run block ``layer`` once on several variants' residuals stacked along the batch
        dimension (the clean call's arguments repeated); returns each variant's output."""
        module, call = self._route(layer)
        return self.run_module(module, call, residuals)

    @torch.no_grad()
    def resume_stacked(
        self,
        starts: Sequence[int],
        residuals: Sequence[torch.Tensor | None] | None = None,
        orders: Sequence[Sequence[int] | None] | None = None,
        observe: Callable[[int, int, torch.Tensor, torch.Tensor], None] | None = None,
        chunk: int | None = None,
    ) -> list[torch.Tensor]:
        """The final residuals of several hook-free variants resumed together.

        Variant v resumes at block ``starts[v]`` from ``residuals[v]`` (default: the clean
        one) and runs ``orders[v]`` (default ``start .. n_layers-1``; a permutation of the
        remaining positions, as in :meth:`resume`). Step by step, the variants that run the
        same block at the same position are stacked along the batch dimension and the block
        runs once for all of them (one variant alone runs exactly as :meth:`resume` does), at
        most ``chunk`` variants per run (None: all of them): the blocks run in order, each once
        per chunk of the variants that reach it, and a model whose weights are computed on
        each read (kept in their stored dtype, :mod:`probekit.model.storage`) computes a
        block's once for all the chunks of a step (``parametrize.cached``: one block's
        float32 weights held at a time), not once per variant. ``observe(v, layer, h_in,
        h_out)`` sees every block run. Apply the model's head (``model.head``) to each
        returned residual for its logits.

        Example:
            >>> from probekit.toy import toy_model, toy_tokens
            >>> model = toy_model(n_layers=3)
            >>> trace = model.trace(model.prepare(toy_tokens())[0])
            >>> a, b = trace.resume_stacked([1, 2], [trace.residuals[0], trace.residuals[1]])
            >>> bool(torch.allclose(model.head(a), trace.resume(1, trace.residuals[0]), atol=1e-5))
            True
        """
        n, k = self.runtime.n_layers, len(starts)
        if chunk is not None and (type(chunk) is not int or chunk < 1):
            raise InputError(f"chunk={chunk!r} is not a positive integer", fix="pass 1 or more")
        step = k if chunk is None else chunk
        residuals = [None] * k if residuals is None else list(residuals)
        orders = [None] * k if orders is None else list(orders)
        plan = []
        for start, order in zip(starts, orders, strict=True):
            if not 0 <= start <= n:
                raise InputError(f"start layer {start} outside [0, {n}]", fix=f"use 0..{n}")
            plan.append(list(range(start, n)) if order is None else list(order))
            if len(plan[-1]) != n - start:
                raise InputError(
                    f"a stacked variant starting at {start} lists {len(plan[-1])} blocks",
                    fix=f"give the order of the {n - start} remaining positions",
                )
        hs = [self.residuals[s] if r is None else r for s, r in zip(starts, residuals, strict=True)]
        for pos in range(min(starts, default=n), n):
            groups: dict[int, list[int]] = {}
            for v in range(k):
                if starts[v] <= pos:
                    groups.setdefault(plan[v][pos - starts[v]], []).append(v)
            for layer, group in groups.items():
                with parametrize.cached():  # weights kept as stored: copied once per group
                    for first in range(0, len(group), step):
                        members = group[first : first + step]
                        outs = self.run_stacked(layer, [hs[v] for v in members])
                        for v, h_out in zip(members, outs, strict=True):
                            if observe is not None:
                                observe(v, layer, hs[v], h_out)
                            hs[v] = h_out
        return hs

    @torch.no_grad()
    def resume(
        self,
        start: int,
        residual: torch.Tensor | None = None,
        order: Sequence[int] | None = None,
        fwd_hooks: HookList = (),
        observe: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits of the forward resumed at block ``start`` (``start == n_layers``: head only).

        ``residual`` replaces the cached input of block ``start`` (default: the clean one);
        ``order`` lists the blocks to run from there on (default ``start .. n_layers-1``), so a
        swap of layers i < j is ``resume(i, order=[j, i+1, ..., i, ...])``; ``fwd_hooks`` are
        active during the resumed part; ``observe(layer, h_in, h_out)`` sees every block run;
        ``out`` is passed to the model's head (``model.head``).

        Example:
            >>> from probekit.toy import toy_model, toy_tokens
            >>> model = toy_model(n_layers=4)
            >>> [batch] = model.prepare(toy_tokens())
            >>> trace = model.trace(batch)
            >>> skipped = trace.resume(4, trace.residuals[3])   # skip layer 3
            >>> bool(torch.allclose(trace.resume(0), trace.logits, atol=1e-5))
            True
        """
        n = self.runtime.n_layers
        if isinstance(start, bool) or not hasattr(start, "__index__") or not 0 <= int(start) <= n:
            raise InputError(
                f"start layer {start!r} is not an integer in [0, {n}]",
                fix=f"use 0..{n} ({n}: the head only)",
            )
        start = int(start)
        h = self.residuals[start] if residual is None else residual
        order = list(range(start, n)) if order is None else check_layer_list(order, n, "order")
        with self.runtime.hooks(fwd_hooks):
            for layer in order:
                h_out = self.run_block(layer, h)
                if observe is not None:
                    observe(layer, h, h_out)
                h = h_out
            return self.runtime.head(h, out)


@torch.no_grad()
def record_trace(
    runtime: Runtime, batch: Batch, fwd_hooks: HookList = (), route: Route = bridge_only
) -> Trace:
    """The clean forward of ``batch`` through ``runtime`` (with ``fwd_hooks``) that keeps only
    each block's input residual and its call arguments; its hook-free block runs go where
    ``route`` says (the handle's ``trace``). Its L block passes are counted on a command's
    live progress line by the forward it runs (:meth:`Runtime.forward`), once."""
    residuals: list[torch.Tensor | None] = [None] * (runtime.n_layers + 1)
    calls: list[tuple[tuple, dict] | None] = [None] * runtime.n_layers
    hf_calls: list[tuple[tuple, dict] | None] = [None] * runtime.n_layers

    def keep(layer: int) -> Callable:
        def fn(tensor: torch.Tensor, hook: Any) -> None:
            residuals[layer] = tensor.detach()

        return fn

    def record(layer: int, into: list) -> Callable:
        def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            into[layer] = (args, dict(kwargs))

        return pre_hook

    hooks = [(hook_name(i, "resid_in"), keep(i)) for i in range(runtime.n_layers)]
    hooks.append((hook_name(runtime.n_layers - 1, "resid_out"), keep(runtime.n_layers)))
    handles = []
    for i, block in enumerate(runtime.blocks):
        handles.append(block.register_forward_pre_hook(record(i, calls), with_kwargs=True))
        inner = getattr(block, "original_component", None)
        if isinstance(inner, nn.Module):  # what the bridge passes the HF block
            hook = record(i, hf_calls)
            handles.append(inner.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        logits = runtime.forward(batch, list(fwd_hooks) + hooks)
    finally:
        for handle in handles:
            handle.remove()
    if any(r is None for r in residuals) or any(c is None for c in calls):
        raise UnsupportedModelError(
            f"the {runtime.architecture} forward did not pass through every block hook",
            fix="use a standard architecture whose forward runs each block once",
        )
    check_finite_stream(residuals, logits)  # type: ignore[arg-type]
    return Trace(runtime, batch, residuals, logits, calls, hf_calls, route)  # type: ignore[arg-type]


def check_finite_stream(residuals: list[torch.Tensor], logits: torch.Tensor) -> None:
    """Raise :class:`NumericalError` naming where a clean forward first turns non-finite."""
    if all_finite(logits) and all(all_finite(r) for r in residuals):
        return
    first = next((i for i, r in enumerate(residuals) if not all_finite(r)), None)
    where = (
        "the output head (the residual stream is finite)"
        if first is None
        else "the embeddings"
        if first == 0
        else f"the output of layer {first - 1}"
    )
    raise NumericalError(
        f"the clean forward has NaN or infinite values, first in {where}",
        fix="check the checkpoint's weights (too large weights overflow) and the dtype "
        "(float16 overflows above 65504; load with dtype=torch.float32)",
    )


__all__ = ["Route", "Trace", "bridge_only", "check_finite_stream", "record_trace"]

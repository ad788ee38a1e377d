"""How a model's blocks write to the residual stream, read from the model itself: the probe
forwards that find the block structure, the hooks that observe or replace each block's
attention and MLP updates, and the replay check :func:`probekit.model.load` runs.

Every block is read as ``h_out = h_in + a + m`` (see :data:`BLOCK_KINDS`); which hook sites
hold ``a`` and ``m`` depends on the structure, so analyzers ask the handle for its
``update_hooks`` and never name the sites. The probes run a
:class:`~probekit.model.runtime.Runtime`; :class:`StructureProbes` keeps what they find.

Example:
    >>> from probekit.toy import toy_model
    >>> read_structure(toy_model("llama").runtime)
    BlockStructure(kind='sum', parallel=False)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from probekit.data import Batch
from probekit.errors import NumericalError, ProbekitError, UnsupportedModelError
from probekit.model.inputs import probe_batch
from probekit.model.runtime import Runtime
from probekit.model.sites import (
    POST_LN_SITES,
    POST_NORM_SITES,
    REQUIRED_SITES,
    HookList,
    hook_name,
)
from probekit.model.trace import Route, bridge_only, record_trace
from probekit.numerics import all_finite, dtype_guard, tolerance, within_tolerance

BLOCK_KINDS = ("sum", "sandwich", "stream", "post_ln")
"""How a block's sublayers write to the residual stream (see the handle's ``structure``):

- ``sum``: ``h_out = h_in + attn_out + mlp_out`` (pre-norm blocks, sequential or parallel),
- ``sandwich``: ``h_out = h_in + norm(attn_out) + norm(mlp_out)`` (post-sublayer norms),
- ``stream``: post-norm blocks (BERT), where the attention hook holds the normalised mid-block
  stream ``h_mid`` and the updates are ``h_mid - h_in`` and ``h_out - h_mid``,
- ``post_ln``: post-norm blocks whose attention hook holds the raw attention output (post-LN
  OPT, probekit's ``post_ln_paper`` model): ``h_mid = LN1(h_in + attn)`` is the first
  LayerNorm's output (``mid_post_ln``), ``h_out = LN2(h_mid + mlp)``, and the updates are
  again ``h_mid - h_in`` and ``h_out - h_mid``.

In both post-norm kinds a sublayer's *update* is the change it makes to the stream, its
LayerNorm included: zeroing the attention update sets ``h_mid = h_in`` (the attention
sublayer and its LayerNorm become the identity; not ``LN(h_in + 0)``), zeroing the MLP update
sets ``h_out = h_mid``, and zeroing both (skipping the block) passes ``h_in`` on unchanged.
"""

MID_SITES = {"stream": "attn_out", "post_ln": "mid_post_ln"}
"""The site holding the mid-block stream ``h_mid`` of the post-norm kinds."""

UPDATE_SITES = {"sum": ("attn_out", "mlp_out"), "sandwich": tuple(POST_NORM_SITES)}
"""The sites holding the attention and MLP updates of the block kinds that have them."""

UNREADABLE_FIX = (
    "use an architecture listed as supported in the architecture table (docs/architectures.md)"
)
"""The fix every refusal of an unreadable block structure names."""


@dataclass(frozen=True)
class BlockStructure:
    """A model's block structure: ``kind`` (one of :data:`BLOCK_KINDS`) and ``parallel``
    (attention and MLP both read the block input)."""

    kind: str
    parallel: bool


def read_structure(runtime: Runtime) -> BlockStructure:
    """How every block of ``runtime`` writes to the residual stream (see
    :attr:`StructureProbes.structure`, which keeps it)."""
    clean = _probe_record(runtime)
    needed = [(site, i) for site in REQUIRED_SITES for i in range(runtime.n_layers)]
    if any(key not in clean for key in needed):
        raise UnsupportedModelError(
            f"the {runtime.architecture} forward does not pass through every block's "
            "residual, attention and MLP hooks",
            fix=UNREADABLE_FIX,
        )
    if not all(all_finite(t) for t in clean.values()):
        raise NumericalError(
            f"the {runtime.architecture} forward overflows (NaN or infinite activations), so "
            "its block structure cannot be read",
            fix="check the checkpoint's weights and the dtype (float16 overflows above "
            "65504; load with dtype=torch.float32)",
        )
    tol = tolerance(runtime.dtype)
    layers = range(runtime.n_layers)
    for kind in ("sum", "sandwich"):
        attn, mlp = UPDATE_SITES[kind]
        if (attn, 0) not in clean or (mlp, 0) not in clean:
            continue
        if all(
            within_tolerance(
                clean["resid_in", i] + clean[attn, i] + clean[mlp, i],
                clean["resid_out", i],
                tol,
            )
            for i in layers
        ) and _edits_honoured(runtime, kind, tol):
            return BlockStructure(kind, _reads_block_input(runtime, kind, clean, tol))
    for kind, mid in MID_SITES.items():
        if _mid_is_state(runtime, clean, tol, mid):
            return BlockStructure(kind, False)
    raise UnsupportedModelError(
        f"the {runtime.architecture} blocks do not write to the residual stream in a way "
        "probekit can read from the bridge's hooks (neither h_out = h_in + attn + mlp, nor "
        "with post-sublayer norms, nor a post-norm mid-block state)",
        fix=UNREADABLE_FIX,
    )


def _probe_record(
    runtime: Runtime, edits: HookList = (), before: Sequence[tuple[str, int]] = ()
) -> dict[tuple[str, int], torch.Tensor]:
    """One probe forward with ``edits``; float64 copies of every update site keyed
    ``(site, layer)``: after the edits, except the ``before`` ones (as computed)."""
    held: dict[tuple[str, int], torch.Tensor] = {}

    def keep(key: tuple[str, int]) -> Callable:
        def fn(tensor: torch.Tensor, hook: Any) -> None:
            held[key] = tensor.detach().double()

        return fn

    sites = ("resid_in", "attn_out", "mlp_out", "resid_out", *POST_NORM_SITES, *POST_LN_SITES)
    names = {
        (site, i): name
        for site in sites
        for i in range(runtime.n_layers)
        if (name := hook_name(i, site)) in runtime.bridge.hook_dict
    }
    first = [(names[key], keep(key)) for key in before if key in names]
    last = [(name, keep(key)) for key, name in names.items() if key not in before]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with dtype_guard(runtime.dtype, runtime.device):
            runtime.forward(_probe(runtime), first + list(edits) + last)
    return held


def _probe(runtime: Runtime) -> Batch:
    """The probe batch of ``runtime`` (its context, vocabulary and device)."""
    return probe_batch(runtime.n_ctx, runtime.d_vocab, runtime.device)


def _edits_honoured(runtime: Runtime, kind: str, tol: float) -> bool:
    """Whether zeroing both updates of every block through the hooks leaves h_out = h_in."""
    edits = [
        hook
        for i in range(runtime.n_layers)
        for sub in ("attn", "mlp")
        for hook in replace_hooks(kind, i, sub, None)
    ]
    got = _probe_record(runtime, edits)
    return all(
        within_tolerance(got["resid_in", i], got["resid_out", i], tol)
        for i in range(runtime.n_layers)
    )


def _reads_block_input(runtime: Runtime, kind: str, clean: dict, tol: float) -> bool:
    """Whether layer 0's MLP update is unchanged when its attention update is zeroed."""
    mlp = UPDATE_SITES[kind][1]
    got = _probe_record(runtime, replace_hooks(kind, 0, "attn", None), before=[(mlp, 0)])
    return within_tolerance(got[mlp, 0], clean[mlp, 0], tol)


def _mid_is_state(runtime: Runtime, clean: dict, tol: float, mid: str = "attn_out") -> bool:
    """Post-norm check: with every block input perturbed but the ``mid`` hook (the attention
    hook, or the first LayerNorm's output) given its clean value, every block output is the
    clean one (the hook holds the whole stream)."""
    if (mid, 0) not in clean:
        return False
    g = torch.Generator().manual_seed(0)

    def value(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return tensor.to(like.device, like.dtype)

    edits = []
    for i in range(runtime.n_layers):
        h = clean["resid_in", i]
        noise = torch.randn(h.shape, generator=g, dtype=h.dtype) * h.std()
        edits += [
            (hook_name(i, "resid_in"), lambda t, hook, v=h + noise: value(v, t)),
            (hook_name(i, mid), lambda t, hook, v=clean[mid, i]: value(v, t)),
        ]
    before = [(mid, i) for i in range(runtime.n_layers)]
    got = _probe_record(runtime, edits, before=before)
    layers = range(runtime.n_layers)
    moved = all(not within_tolerance(got[mid, i], clean[mid, i], tol) for i in layers)
    return moved and all(
        within_tolerance(got["resid_out", i], clean["resid_out", i], tol) for i in layers
    )


def pattern_edits_work(runtime: Runtime) -> bool:
    """Whether editing ``attn_pattern`` changes ``runtime``'s output (see the handle's
    ``supports_pattern_edits``)."""
    if hook_name(0, "attn_pattern") not in runtime.bridge.hook_dict:
        return False
    tokens = torch.ones(1, 3, dtype=torch.long, device=runtime.device)
    batch = Batch(tokens, torch.ones_like(tokens))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clean = runtime.forward(batch)
        zeroed = runtime.forward(
            batch, [(hook_name(0, "attn_pattern"), lambda t, hook: torch.zeros_like(t))]
        )
    return not torch.equal(clean, zeroed)


def update_hooks(
    kind: str,
    layer: int,
    on_layer: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None],
) -> list[tuple[str, Callable]]:
    """Hooks that call ``on_layer(h_in, a, m, h_out)`` once block ``layer`` of a model whose
    blocks are of ``kind`` has run (see the handle's ``update_hooks``)."""
    held: dict[str, torch.Tensor] = {}

    def keep(key: str) -> Callable:
        def fn(tensor: torch.Tensor, hook: Any) -> None:
            held[key] = tensor.detach().clone()  # blocks may add to it in place (Falcon)

        return fn

    def finish(tensor: torch.Tensor, hook: Any) -> None:
        h_in, h_out = held.pop("in"), tensor.detach()
        if kind in MID_SITES:
            mid = held.pop("mid")
            on_layer(h_in, mid - h_in, h_out - mid, h_out)
        else:
            on_layer(h_in, held.pop("attn"), held.pop("mlp"), h_out)

    hooks = [(hook_name(layer, "resid_in"), keep("in"))]
    if kind in MID_SITES:
        hooks.append((hook_name(layer, MID_SITES[kind]), keep("mid")))
    else:
        attn, mlp = UPDATE_SITES[kind]
        hooks += [(hook_name(layer, attn), keep("attn")), (hook_name(layer, mlp), keep("mlp"))]
    return hooks + [(hook_name(layer, "resid_out"), finish)]


def replace_hooks(
    kind: str,
    layer: int,
    sublayer: str,
    value: torch.Tensor | None,
    at: torch.Tensor | None = None,
) -> list[tuple[str, Callable]]:
    """Hooks that replace the ``sublayer`` ('attn' or 'mlp') update of block ``layer`` of a
    model whose blocks are of ``kind`` by ``value`` (broadcast; ``None`` = zero), at the
    positions of the bool ``[batch, pos]`` mask ``at`` only (``None``: everywhere)."""

    def update(like: torch.Tensor) -> torch.Tensor:
        if value is None:
            return torch.zeros_like(like)
        return value.to(like.device, like.dtype).expand_as(like)

    def placed(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        return new if at is None else torch.where(at.to(old.device)[..., None], new, old)

    if kind not in MID_SITES:
        site = UPDATE_SITES[kind][0 if sublayer == "attn" else 1]
        return [(hook_name(layer, site), lambda t, hook: placed(update(t).clone(), t))]
    held: dict[str, torch.Tensor] = {}

    def keep(tensor: torch.Tensor, hook: Any) -> None:
        held["base"] = tensor

    def replace(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
        base = held.pop("base")
        return placed(base + update(base), tensor)

    mid = MID_SITES[kind]
    before, site = ("resid_in", mid) if sublayer == "attn" else (mid, "resid_out")
    return [(hook_name(layer, before), keep), (hook_name(layer, site), replace)]


class StructureProbes:
    """The structure probes of a :class:`Runtime`, each result kept once found: its block
    :attr:`structure`, whether :attr:`pattern_edits` work, and the replay :meth:`check` (whose
    resumed blocks take ``route``, as the model's traces do).

    Example:
        >>> from probekit.toy import toy_model
        >>> probes = StructureProbes(toy_model("bert").runtime)
        >>> probes.structure, probes.pattern_edits
        (BlockStructure(kind='stream', parallel=False), False)
    """

    def __init__(self, runtime: Runtime, route: Route = bridge_only) -> None:
        self.runtime = runtime
        self.route = route

    @cached_property
    def structure(self) -> BlockStructure:
        """How every block writes to the residual stream (:func:`read_structure`, once)."""
        return read_structure(self.runtime)

    @cached_property
    def pattern_edits(self) -> bool:
        """Whether editing ``attn_pattern`` changes the output (:func:`pattern_edits_work`,
        once)."""
        return pattern_edits_work(self.runtime)

    def check(self) -> None:
        """Refuse, with :class:`UnsupportedModelError`, a model whose numbers probekit would
        get wrong: blocks whose updates cannot be read (:attr:`structure`), or a forward that
        resuming from the first block or applying the head to the last residual does not
        reproduce (the handle's ``check_structure``)."""
        try:
            self._check_replay()
        except NumericalError:
            return  # an overflowing forward: the analyses name the first non-finite layer
        except ProbekitError:
            raise
        except Exception as err:  # the bridge's own forward fails on this architecture
            raise UnsupportedModelError(
                f"TransformerLens' bridge cannot run a {self.runtime.architecture} forward "
                f"({type(err).__name__}: {err})",
                fix=UNREADABLE_FIX,
            ) from err

    def _check_replay(self) -> None:
        """Resuming the probe forward from block 0, and the head on the last residual, give
        the model's own logits."""
        self.structure  # noqa: B018  (raises when no block structure fits)
        runtime = self.runtime
        with dtype_guard(runtime.dtype, runtime.device):
            trace = record_trace(runtime, _probe(runtime), route=self.route)
            for start, what in ((0, "the blocks replayed"), (runtime.n_layers, "the output head")):
                if not within_tolerance(
                    trace.resume(start), trace.logits, tolerance(runtime.dtype)
                ):
                    raise UnsupportedModelError(
                        f"probekit cannot reproduce the {runtime.architecture} forward from "
                        f"{what} (resumed logits differ from the model's own)",
                        fix=UNREADABLE_FIX,
                    )


__all__ = [
    "BLOCK_KINDS",
    "MID_SITES",
    "UPDATE_SITES",
    "BlockStructure",
    "StructureProbes",
    "pattern_edits_work",
    "read_structure",
    "replace_hooks",
    "update_hooks",
]

"""AdamW for a stack of runs: every tensor carries a leading run axis ``M``.

Each run has its own learning rate, weight decay and gradient-clip norm; the betas, eps and the
schedule are shared. Decay is decoupled (``p *= 1 - lr * wd``) and applies to the tensors that
:func:`probekit.training.models.decays` names. A run whose update is not finite, or that is
marked inactive, keeps its parameters and moments unchanged.

Example:
    >>> import torch
    >>> params = {"w": torch.ones(2, 3)}
    >>> opt = StackedAdamW(params, lr=[0.1, 0.0], weight_decay=[0.0, 0.0], grad_clip=[0.0, 0.0])
    >>> opt.step([torch.ones(2, 3)], step=0, multiplier=1.0, active=torch.tensor([True, True]))
    tensor([True, True])
    >>> [round(v, 4) for v in params["w"][:, 0].tolist()]
    [0.9, 1.0]
    >>> sorted(opt.state_dict(index=0)["exp_avg"])
    ['w']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


def _all(name: str) -> bool:
    return True


class StackedAdamW:
    """AdamW over ``params`` (name -> tensor ``[M, ...]``) with per-run lr, decay and clip."""

    def __init__(
        self,
        params: dict[str, torch.Tensor],
        lr: Sequence[float],
        weight_decay: Sequence[float],
        grad_clip: Sequence[float],
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        decays: Callable[[str], bool] = _all,
    ) -> None:
        self.params = params
        device = next(iter(params.values())).device
        self.lr = torch.tensor(list(lr), device=device)
        self.wd = torch.tensor(list(weight_decay), device=device)
        self.clip = torch.tensor(list(grad_clip), device=device)
        self.betas, self.eps, self.decays = betas, eps, decays
        self.exp_avg = {k: torch.zeros_like(v) for k, v in params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(v) for k, v in params.items()}

    @property
    def n_runs(self) -> int:
        return int(self.lr.shape[0])

    def _clip_coefficients(self, grads: list[torch.Tensor]) -> torch.Tensor:
        M = self.n_runs
        norm = torch.stack([g.float().pow(2).reshape(M, -1).sum(1) for g in grads]).sum(0)
        norm = norm.sqrt()
        return torch.where(
            self.clip > 0, (self.clip / (norm + 1e-6)).clamp(max=1.0), torch.ones_like(norm)
        )

    @torch.no_grad()
    def step(
        self, grads: list[torch.Tensor], step: int, multiplier: float, active: torch.Tensor
    ) -> torch.Tensor:
        """Update ``step`` (0-based) with ``grads`` (in the order of ``params``) at
        ``lr * multiplier``; runs where ``active`` is False are left as they were.

        A run whose update would make a weight or moment non-finite is left as it was too.
        Returns, per run, whether its update was applied (a tensor on the parameters' device;
        nothing here waits for the device: the undo is a ``torch.where``, not a branch). The
        update is computed out of place and each tensor takes the new values of the applied
        runs in one ``torch.where`` into itself (no copy of the old values is kept)."""
        updated = self.update(grads, step, multiplier)
        finite = torch.ones(self.n_runs, dtype=torch.bool, device=self.lr.device)
        for tensors in updated.values():
            for t in tensors:
                finite &= torch.isfinite(t.reshape(self.n_runs, -1)).all(1)
        applied = finite & active
        for k, new in updated.items():
            now = (self.params[k], self.exp_avg[k], self.exp_avg_sq[k])
            keep = applied.view((self.n_runs,) + (1,) * (now[0].dim() - 1))
            for t, value in zip(now, new, strict=True):
                torch.where(keep, value, t, out=t)
        return applied

    def update(
        self, grads: list[torch.Tensor], step: int, multiplier: float
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The AdamW update of every run, out of place (nothing is changed): per parameter
        name the new weights, first and second moments, which :meth:`step` applies."""
        coef = self._clip_coefficients(grads)
        t = step + 1
        lr_t = self.lr * multiplier
        b1, b2 = self.betas
        bc1 = 1 - b1**t
        bc2_sqrt = math.sqrt(1 - b2**t)
        step_size = lr_t / bc1
        out = {}
        for (k, p), g in zip(self.params.items(), grads, strict=True):
            shape = (self.n_runs,) + (1,) * (p.dim() - 1)
            g = g * coef.view(shape)
            ea = self.exp_avg[k].lerp(g, 1 - b1)
            eas = self.exp_avg_sq[k].mul(b2).addcmul_(g, g, value=1 - b2)
            denom = (eas.sqrt() / bc2_sqrt).add_(self.eps)
            change = step_size.view(shape) * ea / denom
            if self.decays(k):
                out[k] = (p.mul((1 - lr_t * self.wd).view(shape)).sub_(change), ea, eas)
            else:
                out[k] = (p - change, ea, eas)
        return out

    def state_dict(self, index: int | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """The moments ``{"exp_avg": {name: t}, "exp_avg_sq": {...}}``, of run ``index`` only
        when given."""
        pick = (lambda t: t) if index is None else (lambda t: t[index])
        return {
            "exp_avg": {k: pick(v) for k, v in self.exp_avg.items()},
            "exp_avg_sq": {k: pick(v) for k, v in self.exp_avg_sq.items()},
        }

    @torch.no_grad()
    def load_state_dict(
        self, state: dict[str, dict[str, torch.Tensor]], index: int | None = None
    ) -> None:
        """Inverse of :meth:`state_dict` (into run ``index`` when given)."""
        for which in ("exp_avg", "exp_avg_sq"):
            target = getattr(self, which)
            for k in target:
                value = state[which][k].to(target[k].device)
                if index is None:
                    target[k].copy_(value)
                else:
                    target[k][index] = value


__all__ = ["StackedAdamW"]

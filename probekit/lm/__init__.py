"""The language-model task, in one place: a byte-level GPT-2 trained on the offline byte corpus,
static or grown in depth (MIDAS), beside the anchor task (:mod:`probekit.anchor`) and on the
same shared training loop (:mod:`probekit.training.loop`).

* :mod:`probekit.lm.corpus`: :class:`ByteCorpus`, the standard library's source read as bytes,
  and its tokens;
* :mod:`probekit.lm.config`: :class:`LMConfig`, a run's settings and their checks;
* :mod:`probekit.lm.training`: :func:`train_lm` and :class:`LMTrainer`, the run's steps
  (growth, MIDAS-plus, update, evaluation);
* :mod:`probekit.lm.checkpoints`: a run's checkpoint folders, written, read back and found
  again when a killed run resumes;
* :mod:`probekit.lm.layernorm_scaling`: LayerNorm Scaling, folded into a plain GPT-2 and kept
  unscaled beside it;
* :mod:`probekit.lm.finetune`: :func:`finetune_lm`, a run fine-tuned on the composition task
  (:mod:`probekit.tasks.compositions`), and :func:`composition_accuracy`, its exact match.

Example:
    >>> from probekit.lm import LMConfig
    >>> LMConfig(n_layers=4, growth="midas").plan().depths
    [2, 4]
"""

from typing import TYPE_CHECKING

from probekit.lazy import lazy_exports

if TYPE_CHECKING:  # the same names, so a type checker sees them as they are, not as Any
    from probekit.lm.config import LMConfig  # noqa: F401
    from probekit.lm.corpus import ByteCorpus  # noqa: F401
    from probekit.lm.finetune import (  # noqa: F401  (composition fine-tuning)
        CompositionAccuracy,
        FinetuneConfig,
        FinetuneRun,
        composition_accuracy,
        finetune_lm,
    )
    from probekit.lm.layernorm_scaling import UNSCALED_LN_FILE  # noqa: F401
    from probekit.lm.training import LMRun, LMTrainer, ResidualScale, train_lm  # noqa: F401

_EXPORTS: dict[str, str] = {
    "ByteCorpus": "probekit.lm.corpus",
    "LMConfig": "probekit.lm.config",
    "LMRun": "probekit.lm.training",
    "LMTrainer": "probekit.lm.training",
    "ResidualScale": "probekit.lm.training",
    "UNSCALED_LN_FILE": "probekit.lm.layernorm_scaling",
    "train_lm": "probekit.lm.training",
    # --- composition fine-tuning ---
    "CompositionAccuracy": "probekit.lm.finetune",
    "FinetuneConfig": "probekit.lm.finetune",
    "FinetuneRun": "probekit.lm.finetune",
    "composition_accuracy": "probekit.lm.finetune",
    "finetune_lm": "probekit.lm.finetune",
}
"""Public name -> its module, imported on first use: ``import probekit.lm`` waits for none
of torch, transformers and pandas until a name is used."""

__all__ = [*_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

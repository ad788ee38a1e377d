"""The data a checkpoint is diagnosed on, chosen from what trained it.

:func:`default_data` picks it: the task's test data for probekit anchor runs (read at the last
position), the validation text of the corpus for probekit LM runs, a text file tokenized with the
model's tokenizer, or tokens drawn uniformly from the vocabulary. :func:`checkpoint_of` lets a
probekit run folder stand for its checkpoint folder. The command line, the demo and notebooks use
these; the run folder itself is read by :func:`probekit.training.runs.load_run`.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from probekit.tasks import AnchorTask
    >>> from probekit.toy import toy_hf_model
    >>> from probekit.training import TrainConfig
    >>> from probekit.training.checkpoint import write_run_config
    >>> run = Path(tempfile.mkdtemp())                        # an anchor run folder
    >>> toy_hf_model("gpt2", n_layers=2).save_pretrained(run / "checkpoint")
    >>> cfg = TrainConfig(batch_size=8, task=AnchorTask(n_train=64, n_test=32))
    >>> _ = write_run_config(run / "checkpoint", "anchor", cfg.to_dict())
    >>> checkpoint_of(run) == str(run / "checkpoint")
    True
    >>> data, positions = default_data(run)
    >>> data["input_ids"].shape[0], positions             # the task's 32 test sequences
    (32, 'last')
    >>> hf = Path(tempfile.mkdtemp())                         # any other model
    >>> toy_hf_model("gpt2", n_layers=2).save_pretrained(hf)
    >>> tokens, positions = default_data(hf, n_sequences=3, seq_len=5)
    >>> tokens.shape, positions                               # drawn from the vocabulary
    (torch.Size([3, 5]), 'all')
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from probekit.errors import InputError

N_SEQUENCES = 32
"""Sequences of data :func:`default_data` cuts when the run does not fix them."""

SEQ_LEN = 64
"""Tokens per sequence :func:`default_data` cuts (capped at the model's context)."""


def checkpoint_of(path: str | os.PathLike) -> str:
    """The checkpoint folder ``path`` stands for: a probekit run folder stands for its
    checkpoint folder (``checkpoint/``, or ``final/`` of a finished LM run); any other path (a
    checkpoint folder, a Hugging Face model directory) stands for itself."""
    from probekit.training.runs import load_run

    run = load_run(path)
    if run is None or run.path == Path(path):
        return os.fspath(path)
    return str(run.path)


def check_text_file(text: str | os.PathLike) -> None:
    """Raise :class:`~probekit.errors.InputError` unless ``text`` is a readable file."""
    if not os.path.isfile(text):
        raise InputError(f"text file {text} does not exist", fix="pass a readable file")


def random_tokens(model: Any, n_sequences: int, length: int, seed: int = 0) -> Any:
    """Tokens drawn uniformly from the vocabulary (ids 1.., leaving 0 for padding).

    ``length`` is capped at the model's context; ``model`` is anything probekit.load accepts.

    Example:
        >>> from probekit.toy import toy_model
        >>> random_tokens(toy_model("gpt2", n_layers=2), 2, 100).shape  # context of 16
        torch.Size([2, 16])
    """
    import torch

    from probekit.model import load

    model = load(model)
    length = min(length, model.n_ctx)
    g = torch.Generator().manual_seed(seed)
    low = 1 if model.d_vocab > 1 else 0
    return torch.randint(low, model.d_vocab, (n_sequences, length), generator=g)


def default_data(
    path: str | os.PathLike,
    *,
    text: str | os.PathLike | None = None,
    n_sequences: int = N_SEQUENCES,
    seq_len: int = SEQ_LEN,
    seed: int = 0,
    model: Any = None,
) -> tuple[Any, str]:
    """The data to diagnose the checkpoint at ``path`` on, and the positions to read it at.

    Without ``text``: a probekit anchor run gives its task's test data with the answer as the
    label of the last position (positions ``"last"``); a probekit LM run gives ``n_sequences``
    windows of ``seq_len`` bytes of its corpus's validation split (``"all"``); any other model
    gives tokens drawn uniformly from its vocabulary with ``seed`` (``"all"``). With ``text``:
    that file, tokenized with the model's tokenizer and cut into at most ``n_sequences``
    sequences of ``seq_len`` tokens (``"all"``). ``model`` is the loaded checkpoint (anything
    :func:`probekit.load` accepts; default: loaded from ``path`` when needed).
    """
    from probekit.training.runs import load_run

    if text is not None:
        check_text_file(text)
    run = None if text is not None else load_run(checkpoint_of(path))
    if run is not None and run.kind == "anchor":
        return _answer_labelled(run.task.dataset("test_data")), "last"
    from probekit.model import load

    model = load(path if model is None else model)
    if run is not None:  # a byte-level LM run: validation text of its corpus
        from probekit.tasks.corpus import ByteCorpus

        corpus = ByteCorpus(run.lm.corpus_root, max_files=run.lm.corpus_max_files)
        return corpus.sequences("validation", min(seq_len, model.n_ctx), n=n_sequences), "all"
    if text is not None:
        return _tokenized(path, model, text, n_sequences, seq_len), "all"
    return random_tokens(model, n_sequences, seq_len, seed=seed), "all"


def _answer_labelled(data: Any) -> dict[str, Any]:
    """Task data as a token dict whose only label is the answer at the last position."""
    import torch

    labels = torch.full_like(data.tokens, -100)
    labels[:, -1] = data.targets
    return {"input_ids": data.tokens, "labels": labels}


def _tokenized(
    path: str | os.PathLike, model: Any, text: str | os.PathLike, n_sequences: int, seq_len: int
) -> Any:
    """``text`` tokenized with the model's tokenizer, as ``[n, length]`` token ids."""
    import torch

    if model.tokenizer is None:
        raise InputError(
            f"{path} has no tokenizer, so --text cannot be tokenized",
            fix="save a tokenizer beside the weights, or leave out --text to use tokens "
            "drawn from the vocabulary",
        )
    with open(text, encoding="utf-8", errors="replace") as handle:
        ids = model.tokenizer(handle.read())["input_ids"]
    length = min(seq_len, model.n_ctx)
    n = min(n_sequences, len(ids) // length)
    if n == 0:
        raise InputError(
            f"{text} has only {len(ids)} tokens, fewer than one sequence of {length}",
            fix="pass a longer text or a smaller --seq-len",
        )
    return torch.tensor(ids[: n * length]).view(n, length)


__all__ = [
    "N_SEQUENCES",
    "SEQ_LEN",
    "check_text_file",
    "checkpoint_of",
    "default_data",
    "random_tokens",
]

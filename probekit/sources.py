"""Where a diagnosis gets its checkpoint and its data, chosen from what trained the checkpoint.

:func:`locate` lets a probekit run folder stand for its checkpoint folder and reads the run;
:func:`check_diagnose_inputs` and :func:`checkpoint_to_diagnose` check a checkpoint path before
anything is loaded. :func:`default_data` picks the data: the task's test data for anchor runs
(read at the last position), the corpus's validation text for LM runs, a text file or data set
tokenized with the model's tokenizer, or tokens drawn from the vocabulary; :func:`data_source`
says in words which. :func:`resolve` gathers it all, once, into the :class:`Source` of one
diagnosis (:func:`probekit.report.diagnose_checkpoint`, ``probekit diagnose``).

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from probekit.anchor import AnchorTask
    >>> from probekit.toy import toy_hf_model
    >>> from probekit.anchor import TrainConfig
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

import codecs
import dataclasses
import difflib
import functools
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probekit.errors import CheckpointError, InputError, ProbekitWarning
from probekit.model.hub import hub_name
from probekit.model.hub import resolve as resolve_hub_name

if TYPE_CHECKING:
    from probekit.data import Data
    from probekit.model import Model
    from probekit.run_folders import RunInfo

N_SEQUENCES = 32
"""Sequences of data :func:`default_data` cuts when the run does not fix them."""

SEQ_LEN = 64
"""Tokens per sequence :func:`default_data` cuts (capped at the model's context)."""


RUN_CONFIG = "run_config.json"
"""The file of a probekit run (:data:`probekit.training.checkpoint.RUN_CONFIG`), named here so
a folder without one is told apart before the trainer (and torch) is imported."""

RUN_CONFIG_PLACES = ("", "checkpoint", "final", "checkpoint.previous")
"""Where :func:`probekit.run_folders.load_run` looks for :data:`RUN_CONFIG` under a path."""


def locate(path: str | os.PathLike) -> tuple[str, RunInfo | None]:
    """The checkpoint folder ``path`` stands for, and the probekit run that wrote it (None: no
    run), read once (:func:`probekit.run_folders.load_run`): a run folder stands for its
    ``checkpoint/`` (``final/`` of a finished LM run), any other path for itself. A folder with
    no :data:`RUN_CONFIG` in :data:`RUN_CONFIG_PLACES` is no run: answered without importing
    the run reader (which imports torch).

    Example:
        >>> locate("no/such/folder")
        ('no/such/folder', None)
    """
    if not any((Path(path) / place / RUN_CONFIG).is_file() for place in RUN_CONFIG_PLACES):
        return os.fspath(path), None
    from probekit.run_folders import load_run

    run = load_run(path)
    if run is None or run.path == Path(path):
        return os.fspath(path), run
    return str(run.path), run


def checkpoint_of(path: str | os.PathLike) -> str:
    """The checkpoint folder ``path`` stands for (:func:`locate`)."""
    return locate(path)[0]


TEXT_CHECK_BYTES = 1 << 20
"""The bytes at the start of a ``--text`` file :func:`check_text_file` reads: a file of any size
costs this much before the model loads (the rest is read only as far as the sequences need,
by :func:`probekit.tasks.text.file_texts`, which refuses a NUL byte there too)."""


def check_text_file(text: str | os.PathLike) -> str | None:
    """Refuse a ``--text`` that is not a readable regular file of text; say how it decodes.

    Raises :class:`~probekit.errors.InputError` for a missing file, a folder, pipe or device,
    an unreadable file, and a binary file (one holding NUL bytes, which UTF-8 text never does:
    UTF-16 text counts as binary). Text that is not valid UTF-8 is accepted: its undecodable
    bytes become U+FFFD replacement characters, and the returned line says so (None when the
    file is valid UTF-8). Only the first :data:`TEXT_CHECK_BYTES` are read here, so a file of
    hundreds of megabytes costs a megabyte.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "t.txt"
        >>> _ = path.write_bytes(b"caf\\xe9 au lait")
        >>> check_text_file(path).endswith("bytes are read as U+FFFD replacement characters")
        True
    """
    path = Path(text)
    if not path.exists():
        raise InputError(f"text file {text} does not exist", fix="pass a readable file")
    if not path.resolve().is_file():
        raise InputError(
            f"text file {text} is not a regular file (a folder, pipe or device)",
            fix="pass a UTF-8 text file",
        )
    try:
        with open(path, "rb") as handle:
            data = handle.read(TEXT_CHECK_BYTES)
    except OSError as err:
        raise InputError(
            f"cannot read text file {text} ({err.strerror or err})", fix="pass a readable file"
        ) from err
    if b"\0" in data:
        raise InputError(
            f"{text} is a binary file (it holds NUL bytes), not text",
            fix="pass a UTF-8 text file (convert UTF-16 text with iconv -t UTF-8)",
        )
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=len(data) < TEXT_CHECK_BYTES)
    except UnicodeDecodeError as err:
        return (
            f"{text} is not valid UTF-8 (first bad byte at offset {err.start}); its "
            "undecodable bytes are read as U+FFFD replacement characters"
        )
    return None


def steps_of(paths: Sequence[str | os.PathLike]) -> list[int | None]:
    """The training step each checkpoint path names (``step100``, ``checkpoint-100``, a Hub
    revision ``@step100``), or ``None``.

    Example:
        >>> steps_of(["run/step100", "run/step20", "org/m@step3", "run/final"])
        [100, 20, 3, None]
    """
    found = []
    for path in paths:
        match = re.search(r"(?:step|checkpoint)[-_]?(\d+)\D*$", os.fspath(path))
        found.append(int(match[1]) if match else None)
    return found


def checkpoints_to_compare(
    items: Sequence[str],
    *,
    names: Sequence[str] | None = None,
    revisions: Sequence[str] | None = None,
    run: bool = False,
) -> dict[str, str]:
    """``{name: checkpoint folder}`` of ``probekit compare``/``timeline``'s arguments: folders
    or Hub names (resolved, :mod:`probekit.model.hub`); one Hub name with ``revisions``; with
    ``run``, one folder that holds checkpoints below it stands for them, ordered by step (a
    run folder with kept checkpoints, ``checkpoints/``, for those). Names
    are ``names`` or the folders' (the run's for a folder named ``checkpoint``, ``name@rev``
    for a Hub revision, a ``/`` of the revision written ``-``: ``name@refs-pr-1``), made
    unique."""
    given, items = list(items), _expanded(list(items), revisions, run)
    if len(items) < 2:
        _too_few(given, len(items), revisions is not None, run)
    folders = []
    for item in items:
        check_path_names(item)
        check_local_folder(item)
        if not os.path.lexists(item) and hub_name(item) is None:
            raise CheckpointError(
                f"checkpoint path {item} does not exist",
                fix="pass Hugging Face model directories or Hub names (org/name[@revision])",
            )
        folder = item if os.path.lexists(item) else os.fspath(resolve_hub_name(item))
        check_checkpoint_folder(folder)
        folders.append(checkpoint_of(folder))
    return dict(zip(_names(items, names), folders, strict=True))


def _too_few(given: list[str], found: int, revisions: bool, run: bool) -> None:
    """Refuse fewer than two checkpoints, saying how ``compare`` or ``timeline`` gets more:
    ``--revisions`` for a Hub name, a run folder or more checkpoints otherwise."""
    what = f"{found} checkpoint(s) to compare"
    hub = "probekit timeline ORG/NAME --revisions REV1,REV2 for a Hub model's revisions"
    if revisions:
        fix = "name two or more revisions in --revisions, e.g. --revisions step1000,step2000"
    elif len(given) == 1 and not os.path.lexists(given[0]) and hub_name(given[0]):
        what += f": {given[0]} is one Hub name and no --revisions were given"
        fix = (
            f"pass probekit timeline {given[0].split('@')[0]} --revisions REV1,REV2 (e.g. "
            "step1000,step2000), or two or more checkpoints"
        )
    elif run:
        fix = f"pass a run folder with checkpoints below it, two or more checkpoints, or {hub}"
    else:
        fix = f"pass two or more checkpoints (folders or Hub names), or {hub}"
    raise InputError(what, fix=fix)


def _expanded(items: list[str], revisions: Sequence[str] | None, run: bool) -> list[str]:
    if revisions is not None:
        if len(items) != 1 or hub_name(items[0]) is None or "@" in items[0]:
            raise InputError(
                "--revisions takes exactly one Hub name without @revision",
                fix="pass e.g. EleutherAI/pythia-70m --revisions step1000,step2000",
            )
        return [f"{items[0]}@{rev.strip()}" for rev in revisions]  # each checked as a name
    if run and len(items) == 1 and os.path.isdir(items[0]):
        from probekit.model.checkpoint import (
            KEPT_CHECKPOINTS,
            checkpoints_below,
            is_checkpoint_folder,
        )

        root = items[0]
        if os.path.isdir(os.path.join(root, KEPT_CHECKPOINTS)):  # a run's kept checkpoints
            root = os.path.join(root, KEPT_CHECKPOINTS)
        if not is_checkpoint_folder(root):
            found = [os.fspath(p) for p in checkpoints_below(root, limit=10_000)]
            steps = steps_of(found)
            order = sorted(range(len(found)), key=lambda i: (steps[i] is None, steps[i] or 0))
            return [found[i] for i in order]
    return items


def _names(items: Sequence[str], given: Sequence[str] | None) -> list[str]:
    if given is not None:
        if len(given) != len(items) or len(set(given)) != len(given):
            raise InputError(
                f"{len(given)} names for {len(items)} checkpoints (or a name twice)",
                fix="give one distinct name per checkpoint",
            )
        return list(given)
    names = []
    for item in items:
        path = Path(item)
        parsed = None if os.path.lexists(item) else hub_name(item)
        if parsed is not None:
            repo, rev = parsed
            name = repo.split("/")[-1] + (f"@{rev.replace('/', '-')}" if rev else "")
        else:
            name = path.parent.name if path.name == "checkpoint" else path.name
        names.append(name.strip(".") or "checkpoint")
    return [n if names.count(n) == 1 else f"{i}-{n}" for i, n in enumerate(names)]


def check_path_names(*paths: str | os.PathLike | None) -> None:
    """Refuse an empty path or one holding a NUL byte (None is no path and passes).

    Example:
        >>> check_path_names("runs/a", None)
        >>> check_path_names("")
        Traceback (most recent call last):
        ...
        probekit.errors.InputError: '' is not a path. Fix: pass a file or folder name.
    """
    for path in paths:
        text = None if path is None else os.fspath(path)
        if text is not None and (not text.strip() or "\0" in text):
            raise InputError(f"{text!r} is not a path", fix="pass a file or folder name")


def check_local_folder(model: str | os.PathLike) -> None:
    """Refuse a name written like a Hub name that does not exist here but whose parent folder
    does (``models/typo`` where ``models/`` is here): a mistyped folder rather than a Hub
    model, said with the closest name beside it (other missing paths: "does not exist").

    Example:
        >>> check_local_folder("no-such-org-here/name")  # no folder no-such-org-here/: a Hub name
    """
    path = Path(model)
    parent = path.parent
    if hub_name(model) is None or os.path.lexists(path) or os.fspath(parent) in ("", "."):
        return
    if not parent.is_dir():
        return
    near = difflib.get_close_matches(path.name, _entries(parent), n=1, cutoff=0.5)
    fix = f"did you mean {parent / near[0]}? (ls {parent})" if near else f"check it: ls {parent}"
    fix += f"; for the Hub model {model}, run probekit where there is no {parent}/ folder"
    raise CheckpointError(
        f"no such folder here: {model} ({parent}/ is here but holds no {path.name})", fix=fix
    )


def _entries(folder: Path) -> list[str]:
    """The names in ``folder`` (up to 1000), or none when it cannot be read."""
    try:
        return sorted(p.name for p in list(folder.iterdir())[:1000])
    except OSError:
        return []


def check_diagnose_inputs(
    model: str | os.PathLike,
    *,
    text: str | os.PathLike | None = None,
    lens: str | os.PathLike | None = None,
) -> None:
    """The checks of a diagnosis's inputs that read only names and the folder tree (torch is not
    imported): the checkpoint path and ``text`` are paths, the checkpoint path exists, and
    ``lens`` (a saved tuned lens) is a folder."""
    check_path_names(model, text)
    check_local_folder(model)
    if not os.path.lexists(model) and hub_name(model) is None:
        raise CheckpointError(
            f"checkpoint path {model} does not exist",
            fix="pass a Hugging Face model directory or a Hub name (org/name[@revision])",
        )
    if lens is not None and not os.path.isdir(lens):
        raise InputError(
            f"--lens {lens} is not a folder", fix="pass a folder written by TunedLens.save()"
        )


def checkpoint_to_diagnose(
    model: str | os.PathLike, *, text: str | os.PathLike | None = None
) -> tuple[str, RunInfo | None, list[str]]:
    """The checkpoint folder ``model`` stands for and the run that wrote it (:func:`locate`; a
    Hugging Face Hub name stands for its snapshot in the local cache, downloaded when allowed),
    checked (:func:`check_checkpoint_folder`, and ``text`` with :func:`check_text_file`), and
    the lines to show the user: ``"warning: ..."`` for a text that is not UTF-8, ``"notice:
    ignored ..."`` per file of the checkpoint probekit ignores
    (:func:`probekit.model.checkpoint.ignored_files`)."""
    from probekit.model.checkpoint import ignored_files

    if not os.path.lexists(model):  # a Hub name (check_diagnose_inputs): its cached snapshot
        model = os.fspath(resolve_hub_name(os.fspath(model)))
    path, run = locate(model)
    check_checkpoint_folder(path)
    warning = check_text_file(text) if text is not None else None
    lines = [f"warning: {warning}"] if warning else []
    if Path(path).parent == Path(model) and Path(path).name == RUN_CONFIG_PLACES[-1]:
        lines.append(
            f"notice: {model} has no checkpoint/ (a save was interrupted between its two "
            f"renames); using the complete {path} (probekit train --out {model} puts it back)"
        )
    return path, run, lines + [f"notice: ignored {line}" for line in ignored_files(path)]


def check_checkpoint_folder(path: str | os.PathLike) -> None:
    """Refuse a folder that holds no checkpoint itself but checkpoints below it, naming them,
    or only the leftovers of an interrupted checkpoint save (``.checkpoint.*``).

    Any other path is left to :func:`probekit.load`, which says what is wrong with it.
    """
    from probekit.model.checkpoint import checkpoints_below, is_checkpoint_folder

    folder = Path(path)
    if not folder.is_dir() or is_checkpoint_folder(folder):
        return
    leftovers = sorted(p.name for p in folder.glob(".checkpoint.*") if p.is_dir())
    if leftovers and not (folder / "checkpoint").exists():
        raise CheckpointError(
            f"{path} holds no checkpoint/: a save was interrupted and left {leftovers}",
            fix=f"run probekit train --out {path} again to recover its last checkpoint",
        )
    found = checkpoints_below(folder)
    if found:
        names = ", ".join(str(p) for p in found)
        raise CheckpointError(
            f"{path} holds no checkpoint itself (no config.json) but {len(found)} below it "
            f"(shown up to 10): {names}",
            fix=f"pass one of them, e.g. probekit diagnose {found[0]}",
        )


@dataclasses.dataclass(frozen=True, eq=False)
class Source:
    """What one diagnosis reads, resolved once by :func:`resolve`: the ``checkpoint`` folder,
    the probekit ``run`` that wrote it (None: none), the ``model`` loaded from it in ``dtype``
    (``"stored"`` or a torch dtype name), the ``data``, the ``positions`` they are read at
    (``"last"``: an anchor task's answer; ``"all"``), their ``description`` in words (in the
    report; :func:`is_random_tokens` reads it), the ``lens_data`` kept apart to fit a tuned lens
    on (None: none asked) and the ``label`` of a checkpoint that is no folder (a Hub name)."""

    checkpoint: str
    run: RunInfo | None
    model: Model
    data: Data
    positions: str
    description: str
    lens_data: Data | None = None
    label: str | None = None
    dtype: str = "stored"


def resolve(
    checkpoint: str | os.PathLike,
    run: RunInfo | None,
    *,
    text: str | os.PathLike | None = None,
    dataset: DatasetChoice | None = None,
    random: bool = False,
    n_sequences: int = N_SEQUENCES,
    seq_len: int = SEQ_LEN,
    seed: int = 0,
    positions: str = "auto",
    tuned_lens: bool = False,
    device: str | None = None,
    dtype: str = "stored",
    device_map: str | None = None,
    label: str | None = None,
    storage: str = "auto",
) -> Source:
    """The :class:`Source` of a diagnosis of the checkpoint folder ``checkpoint`` written by the
    run ``run``, as :func:`locate` gives them (the run folder is not read again): the checkpoint
    loaded (in ``dtype``, its weights kept as ``storage`` says (:func:`probekit.load`), on
    ``device`` or spread by ``device_map``), the data
    :func:`default_data` picks (``text``, ``dataset``, ``random``, ``n_sequences``,
    ``seq_len``, ``seed``) at their positions (or ``positions`` unless "auto"), and with
    ``tuned_lens`` the data to fit a lens on.

    Example:
        >>> import tempfile
        >>> from probekit.toy import toy_hf_model
        >>> folder = tempfile.mkdtemp()
        >>> toy_hf_model("gpt2", n_layers=2).save_pretrained(folder)
        >>> source = resolve(*locate(folder), random=True, n_sequences=3, seq_len=5)
        >>> source.data.shape, source.positions, source.description
        (torch.Size([3, 5]), 'all', 'tokens drawn uniformly from the vocabulary (seed 0)')
    """
    import torch

    from probekit.model import load

    torch_dtype = None if dtype == "stored" else getattr(torch, dtype)
    model = load(
        checkpoint, device=device, dtype=torch_dtype, storage=storage, device_map=device_map
    )
    choice = _Choice(text, dataset, random, n_sequences, seq_len, seed)
    pick = _picker(checkpoint, lambda: run, model, choice)
    data, description, found = pick(fit=False)
    return Source(
        checkpoint=os.fspath(checkpoint),
        run=run,
        model=model,
        data=data,
        positions=found if positions == "auto" else positions,
        description=description,
        lens_data=pick(fit=True)[0] if tuned_lens else None,
        label=label,
        dtype=dtype,
    )


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
    dataset: DatasetChoice | None = None,
    random: bool = False,
    n_sequences: int = N_SEQUENCES,
    seq_len: int = SEQ_LEN,
    seed: int = 0,
    model: Any = None,
    purpose: str = "diagnose",
) -> tuple[Any, str]:
    """The data to diagnose the checkpoint at ``path`` on, and the positions to read it at.

    Chosen by the caller: ``text`` (a text file) or ``dataset`` (a :class:`DatasetChoice`),
    tokenized and cut into at most ``n_sequences`` sequences of ``seq_len`` tokens, or
    ``random`` (tokens drawn from the vocabulary with ``seed``); positions ``"all"``.
    Otherwise from what trained it: an anchor run's task's test data, the answer the label of
    the last position (``"last"``); an LM run's corpus's validation split; for any other model
    with a tokenizer the standard library's sources (:func:`probekit.tasks.text.stdlib_texts`),
    without one drawn tokens. Text and task data come as a dict whose ``"description"`` says
    what they are. ``model``: the loaded checkpoint (default: loaded from ``path`` if needed).

    ``purpose="fit"`` gives data to fit a tuned lens on, kept apart from the diagnosed data:
    the task's, corpus's or standard library's training split, the sequences of ``text`` or
    the data set after the diagnosed ones, or tokens drawn with ``seed + 1``.
    """
    if purpose not in ("diagnose", "fit"):
        raise InputError(f"unknown purpose {purpose!r}", fix="use 'diagnose' or 'fit'")
    choice = _Choice(text, dataset, random, n_sequences, seq_len, seed)
    pick = _picker(path, lambda: locate(path)[1], model, choice)
    data, description, positions = pick(fit=purpose == "fit")
    if isinstance(data, dict):  # text and task data say what they are
        data = {**data, "description": description}
    return data, positions


@dataclasses.dataclass(frozen=True)
class _Choice:
    """The data a caller asked for (:func:`default_data`'s arguments): ``text``, ``dataset``
    or ``random`` tokens, cut into ``n_sequences`` sequences of ``seq_len`` tokens, ``seed``
    for drawn tokens."""

    text: str | os.PathLike | None
    dataset: DatasetChoice | None
    random: bool
    n_sequences: int
    seq_len: int
    seed: int

    @property
    def made(self) -> bool:
        """Whether the caller chose data (else the run's or the model's default is used)."""
        return self.text is not None or self.dataset is not None or self.random


def _picker(
    path: str | os.PathLike,
    read_run: Callable[[], RunInfo | None],
    model: Any,
    choice: _Choice,
) -> Callable[..., tuple[Any, str, str]]:
    """:func:`_pick` bound to one ``choice`` of data, called with ``fit``; ``choice.text`` is
    checked here first. Data the caller chose come before the run that wrote the checkpoint,
    so the run (``read_run()``) is read only when the caller chose none."""
    if choice.text is not None:
        check_text_file(choice.text)
    return functools.partial(_pick, path, None if choice.made else read_run(), model, choice)


def _pick(
    path: str | os.PathLike,
    run: RunInfo | None,
    model: Any,
    choice: _Choice,
    *,
    fit: bool,
) -> tuple[Any, str, str]:
    """:func:`default_data`'s choice, the run ``run`` already read (None: no probekit run, or
    data the caller chose): the data, what they are in words, and the positions to read them
    at."""
    if run is not None and run.task is not None:  # an anchor run (the kind that has a task)
        task = run.task
        data = task.generate("train", min(task.n_train, 2000)) if fit else task.dataset("test_data")
        return *_answer_labelled(data), "last"
    from probekit.model import load

    model = load(path if model is None else model)
    if run is not None and run.lm is not None:  # a byte-level LM run: text of its corpus
        from probekit.lm.corpus import ByteCorpus

        corpus = ByteCorpus(run.lm.corpus_root, max_files=run.lm.corpus_max_files)
        split = "train" if fit else "validation"
        length = min(choice.seq_len, model.n_ctx)
        tokens = corpus.sequences(split, length, n=choice.n_sequences)
        return tokens, f"the {split} split of the run's byte corpus", "all"
    if choice.random or model.tokenizer is None and not choice.made:
        if not choice.random and not fit:
            warn_no_tokenizer(path)
        seed = choice.seed + fit
        drawn = random_tokens(model, choice.n_sequences, choice.seq_len, seed=seed)
        return drawn, f"{RANDOM_TOKENS_WORDS} (seed {seed})", "all"
    texts, what, skip = texts_of(choice.text, choice.dataset, fit)
    length, n = min(choice.seq_len, model.n_ctx), choice.n_sequences
    return *_tokenized(path, model, texts, what, n, length, skip * n), "all"


def warn_no_tokenizer(path: str | os.PathLike) -> None:
    """Warn (:class:`~probekit.errors.ProbekitWarning`) that the checkpoint at ``path`` has no
    tokenizer, so it is diagnosed on random tokens, and say how to give it text."""
    import warnings

    warnings.warn(
        f"{path} has no tokenizer, so it is diagnosed on tokens drawn uniformly from the "
        "vocabulary (random tokens, not language); to diagnose text, save the model's "
        "tokenizer into that folder (tokenizer.save_pretrained(FOLDER)) and pass --text FILE "
        "or --dataset NAME, or pass --random-tokens to choose random tokens without this warning",
        ProbekitWarning,
        stacklevel=4,
    )


@dataclasses.dataclass(frozen=True)
class DatasetChoice:
    """A data set's text as ``--dataset`` names it: ``name`` (a Hugging Face ``datasets``
    name, a ``save_to_disk`` folder or a local .jsonl/.json/.parquet/.csv/.txt file),
    ``config``, ``split`` (default: "validation" for a named data set, "train" for a file)
    and the text ``column``."""

    name: str
    config: str | None = None
    split: str | None = None
    column: str = "text"

    def describe(self) -> str:
        """The data set in words, e.g. ``data set wikitext (config wikitext-2-raw-v1, split
        validation, column text)``."""
        parts = [f"config {self.config}"] if self.config else []
        parts += [f"split {self.split}"] if self.split else []
        return f"data set {self.name} ({', '.join([*parts, f'column {self.column}'])})"


def check_dataset(dataset: DatasetChoice | None) -> str | None:
    """Open the data set ``dataset`` names and read its first text, so a wrong name, split or
    column is reported before a model loads (``None``: nothing to check). A ``.txt`` file is
    checked as ``--text`` is (:func:`check_text_file`); returns its warning for text that is
    not UTF-8, else None."""
    if dataset is None:
        return None
    from probekit.tasks.text import dataset_texts

    warning = None
    if Path(dataset.name).suffix == ".txt" and os.path.lexists(dataset.name):
        warning = check_text_file(dataset.name)
    texts = dataset_texts(
        dataset.name, config=dataset.config, split=dataset.split, column=dataset.column
    )
    if next(texts, None) is None:
        raise InputError(
            f"{dataset.describe()} holds no text", fix="pass another split or --column"
        )
    return warning


def texts_of(
    text: str | os.PathLike | None, dataset: DatasetChoice | None, fit: bool
) -> tuple[Any, str, int]:
    """The texts :func:`default_data` tokenizes for a text file ``text``, a data set
    ``dataset`` or else the standard library's sources (with ``fit``, those to fit a lens
    on), their description in words, and how many blocks of sequences to skip (a lens is
    fitted on the sequences after the diagnosed ones of the same text).

    Example:
        >>> texts, what, skip = texts_of(None, None, fit=False)
        >>> isinstance(next(texts), str), what.startswith("the Python standard library"), skip
        (True, True, 0)
    """
    from probekit.tasks import text as sources

    if text is not None:
        return sources.file_texts(text), f"text file {os.path.abspath(text)}", int(fit)
    if dataset is not None:
        column = sources.dataset_column(  # "text": maybe the only one
            dataset.name, config=dataset.config, split=dataset.split, column=dataset.column
        )
        dataset = dataclasses.replace(dataset, column=column)
        texts = sources.dataset_texts(
            dataset.name, config=dataset.config, split=dataset.split, column=dataset.column
        )
        return texts, dataset.describe(), int(fit)
    split = "train" if fit else "validation"
    what = f"the Python standard library's sources ({split} files; real text shipped with Python)"
    return sources.stdlib_texts(split), what, 0


RANDOM_TOKENS_WORDS = "tokens drawn uniformly from the vocabulary"
"""How :func:`data_source` names tokens drawn at random (``--random-tokens``, or a model with
no tokenizer): the only data on which being "at chance" says nothing about the model."""


def is_random_tokens(source: str | None) -> bool:
    """Whether the data source ``source`` (:func:`data_source`'s words) is random tokens.

    Example:
        >>> is_random_tokens(data_source("gpt2", None)), is_random_tokens("a text file")
        (True, False)
    """
    return isinstance(source, str) and source.startswith(RANDOM_TOKENS_WORDS)


def data_source(model: str | os.PathLike, data: Any, *, seed: int = 0) -> str:
    """In words, where the ``data`` :func:`default_data` chose for the checkpoint path
    ``model`` came from (``seed`` as passed to it): data that say what they are (text, a
    task's :meth:`~probekit.data.TaskData.description`, see :func:`probekit.data.describe`)
    are taken at their word.

    Example:
        >>> data_source("gpt2", None, seed=3)
        'tokens drawn uniformly from the vocabulary (seed 3)'
    """
    from probekit.data import describe

    if (described := describe(data)) is not None:
        return described
    if locate(model)[1] is not None:
        return "the validation split of the run's byte corpus"
    return f"{RANDOM_TOKENS_WORDS} (seed {seed})"


def _answer_labelled(data: Any) -> tuple[dict[str, Any], str]:
    """Task data as a token dict whose only label is the answer at the last position, and
    what they are in words."""
    import torch

    labels = torch.full_like(data.tokens, -100)
    labels[:, -1] = data.targets
    described = f"{data.description()} stored with the run (answer at the last token)"
    return {"input_ids": data.tokens, "labels": labels}, described


def text_tokens(
    path: str | os.PathLike,
    model: Any,
    text: str | os.PathLike,
    n_sequences: int,
    seq_len: int,
    after: bool = False,
) -> Any:
    """The text file ``text`` tokenized with the tokenizer of ``model`` (the checkpoint at
    ``path``) as ``[n, seq_len]`` token ids, each window with the tokenizer's special tokens;
    with ``after``, the windows that follow the first ``n_sequences`` (to fit a lens on)."""
    from probekit.tasks.text import file_texts

    length = min(seq_len, model.n_ctx)
    what = f"text file {os.path.abspath(text)}"
    skip = n_sequences if after else 0
    tokens, _ = _tokenized(path, model, file_texts(text), what, n_sequences, length, skip)
    return tokens["input_ids"]


def _tokenized(
    path: str | os.PathLike,
    model: Any,
    texts: Any,
    what: str,
    n_sequences: int,
    length: int,
    skip: int = 0,
) -> tuple[dict[str, Any], str]:
    """``texts`` tokenized with the model's tokenizer into ``[n, length]`` token ids (after
    the first ``skip`` windows), and what they are in words (``what``, tokenized)."""
    import torch

    from probekit.tasks.text import token_windows

    if model.tokenizer is None:
        raise InputError(
            f"{path} has no tokenizer, so {what} cannot be tokenized",
            fix="save a tokenizer beside the weights, or pass --random-tokens to use tokens "
            "drawn from the vocabulary",
        )
    windows = token_windows(model.tokenizer, texts, length, n_sequences, skip=skip)
    if not windows:
        after = " after the diagnosed sequences, to fit a lens on," if skip else ""
        raise InputError(
            f"{what} has fewer tokens{after} than one sequence of {length}",
            fix="pass a longer text or a smaller --seq-len (or --lens DIR)",
        )
    return {"input_ids": torch.tensor(windows)}, f"{what}, tokenized with the model's tokenizer"


__all__ = [
    "DatasetChoice",
    "N_SEQUENCES",
    "SEQ_LEN",
    "Source",
    "check_checkpoint_folder",
    "check_dataset",
    "check_diagnose_inputs",
    "check_path_names",
    "check_text_file",
    "checkpoint_of",
    "checkpoint_to_diagnose",
    "checkpoints_to_compare",
    "data_source",
    "default_data",
    "RANDOM_TOKENS_WORDS",
    "is_random_tokens",
    "locate",
    "random_tokens",
    "resolve",
    "steps_of",
    "text_tokens",
    "texts_of",
]

"""The one page shell of probekit's HTML pages: a diagnosis report, the comparison and timeline
page, the demo's index.

Each page brings only what it says; the shell gives it the layout and the styles every page
shares (:data:`STYLE`, one column as wide as the widest figure), plotly.js once (embedded, so
the page opens offline, or read from one shared copy), each figure's container
(:func:`figure_html`, :func:`figure_section`, :func:`side_by_side`), the check of an output folder
before any work (:func:`check_out_dir`), the folder written whole (:func:`page_folder`: a
temporary folder swapped in) and the figures' PNG and SVG copies (:func:`export_figures`).

Imports nothing heavy at module level: the command line checks ``--out`` with it before torch,
plotly or the analyses load.

Example:
    >>> import plotly.graph_objects as go
    >>> body = figure_section(go.Figure(go.Bar(x=[0, 1], y=[1, 2])))
    >>> text = html_page("a page", body, plotly_src="plotly.min.js")
    >>> text.startswith("<!DOCTYPE html>"), text.count("plotly-graph-div")
    (True, 1)
"""

from __future__ import annotations

import html
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probekit.errors import InputError
from probekit.io import atomic_write_text, swapped_directory

if TYPE_CHECKING:  # plotly loads only where a figure is drawn
    import plotly.graph_objects as go

STYLE = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2rem auto;
       max-width: %(width)spx; padding: 0 1.5rem; color: #222; line-height: 1.5; }
h1 { font-size: 1.7rem; margin-bottom: .2rem; }
.sub { color: #666; margin-top: 0; }
.banner, .warnings { background: #fff4e0; border-left: 4px solid #e08a00; padding: .6rem 1.2rem; }
.warnings { margin: 1rem 0; }
.verdict { background: #f4f7fb; border-left: 4px solid #1f77b4; padding: .8rem 1.2rem; }
.verdict li { margin: .3rem 0; }
.conclusion { font-weight: 600; }
.explain { color: #444; }
table { border-collapse: collapse; font-size: .9rem; }
td, th { border-bottom: 1px solid #ddd; padding: .25rem .8rem; text-align: left; }
section { margin-top: 2.2rem; }
.cards { display: grid; grid-template-columns: 1fr 1fr; gap: 1.5rem; }
.card { min-width: 0; overflow: hidden; }
"""
"""The styles of every page (``%(width)s``: the column's width in pixels): the title and the
lines under it (``sub``), a notice above the title (``banner``) or under a table
(``warnings``), a report's verdict, conclusions and explanations, tables, sections, and cards
side by side."""

_RESIZE_CARDS = (
    # each figure drew itself while the page was parsed, before the next card existed and took
    # its share of the row: redraw every figure at its card's width
    "<script>window.addEventListener('load', () => document.querySelectorAll("
    "'.js-plotly-plot').forEach(plot => Plotly.Plots.resize(plot)));</script>"
)


def html_page(
    title: str,
    body: str,
    *,
    heading: str | None = None,
    banner: str = "",
    plotly_src: str | None = None,
) -> str:
    """A whole HTML page: ``title`` (the heading too unless ``heading``), ``banner`` (words
    shown above the heading, e.g. "smoke run"), then ``body`` (HTML). plotly.js is embedded
    once, or read from ``plotly_src`` (a relative path, e.g. ``../plotly.min.js`` shared by
    the pages of a demo) when given. The column is as wide as the widest figure.

    Example:
        >>> text = html_page("t", "<p>hi</p>", banner="smoke run", plotly_src="plotly.min.js")
        >>> text[text.index("<body>"):]
        "<body>\\n<p class='banner'>smoke run</p><h1>t</h1>\\n<p>hi</p>\\n</body></html>\\n"
    """
    from probekit import figures

    notice = f"<p class='banner'>{html.escape(banner)}</p>" if banner else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>'
        f"{html.escape(title)}</title>\n<style>{STYLE % {'width': figures.MAX_WIDTH}}</style>\n"
        f"{plotly_script(plotly_src)}\n</head><body>\n"
        f"{notice}<h1>{html.escape(title if heading is None else heading)}</h1>\n{body}\n"
        "</body></html>\n"
    )


def plotly_script(src: str | None = None) -> str:
    """The ``<script>`` of plotly.js: embedded whole, or read from ``src`` when given.

    Example:
        >>> plotly_script("../plotly.min.js")
        '<script src="../plotly.min.js"></script>'
    """
    if src is not None:
        return f'<script src="{html.escape(src)}"></script>'
    import plotly.offline

    return f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'


def sub(text: str) -> str:
    """A line under the page's title (what was measured, on what data), in grey.

    Example:
        >>> sub("Data: <3 sentences>")
        '<p class="sub">Data: &lt;3 sentences&gt;</p>'
    """
    return f'<p class="sub">{html.escape(text)}</p>'


def figure_html(fig: go.Figure, *, fill: bool = False) -> str:
    """The ``<div>`` of a plotly figure (plotly.js comes once, from :func:`html_page`): at its own
    size, or with ``fill`` as wide as its box (a card), following the box when it resizes."""
    if not fill:
        return fig.to_html(full_html=False, include_plotlyjs=False)
    return fig.to_html(
        full_html=False, include_plotlyjs=False, default_width="100%", config={"responsive": True}
    )


def figure_section(fig: go.Figure) -> str:
    """A figure in a section of its own."""
    return f"<section>{figure_html(fig)}</section>"


def side_by_side(cards: Sequence[str]) -> str:
    """``cards`` (HTML, each a ``<div class='card'>``) side by side, two to a row; their
    figures (:func:`figure_html` with ``fill``) are redrawn at the cards' widths once the page
    has loaded."""
    return "<div class='cards'>" + "".join(cards) + "</div>" + _RESIZE_CARDS


def write_json(path: str | os.PathLike, value: Any) -> Path:
    """Write ``value`` (numpy / torch scalars allowed) as indented JSON, atomically.

    Example:
        >>> import tempfile, torch
        >>> path = write_json(Path(tempfile.mkdtemp()) / "a.json", {"share": torch.tensor(0.5)})
        >>> json.loads(path.read_text())
        {'share': 0.5}
    """
    from probekit.result import json_ready

    return atomic_write_text(path, json.dumps(json_ready(value), indent=1))


@contextmanager
def page_folder(out: str | os.PathLike, what: str = "report") -> Iterator[Path]:
    """Yield an empty temporary folder beside ``out`` to write a page's files into; when the
    block ends without an error it replaces ``out`` whole
    (:func:`~probekit.io.swapped_directory`).

    ``out`` thus always holds one complete set of files: those of an older page there are
    gone, and a failure leaves the older folder as it was and no temporary folder. An OSError
    (disk full) is raised as one :class:`~probekit.errors.InputError` naming ``what`` was
    written.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "report"
        >>> with page_folder(out) as tmp:
        ...     _ = atomic_write_text(tmp / "report.html", "<p>new</p>")
        >>> sorted(p.name for p in out.iterdir())
        ['report.html']
    """
    try:
        with swapped_directory(out) as tmp:
            yield tmp
    except OSError as err:
        raise InputError(
            f"could not write the {what} to {out} ({err.strerror or err}); nothing changed",
            fix="free disk space or choose another --out",
        ) from err


def is_report_folder(path: str | os.PathLike) -> bool:
    """Whether the folder ``path`` holds a report probekit wrote: a summary.json with the
    ``model``, ``verdict`` and ``headline`` of a diagnosis.

    Example:
        >>> import tempfile
        >>> is_report_folder(tempfile.mkdtemp())
        False
    """
    summary = Path(path) / "summary.json"
    try:
        if not summary.resolve().is_file() or summary.stat().st_size > 2**26:
            return False
        value = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # JSON nested too deep: RecursionError
        return False
    return isinstance(value, dict) and {"model", "verdict", "headline"} <= set(value)


def _check_degenerate(text: str, resolved: Path, protect: Iterable[Any]) -> None:
    """Refuse an output folder whose replacement would delete something it must not."""
    if len(os.fsencode(resolved.name)) > 200:
        raise InputError(
            f"--out name {resolved.name[:40]}... is too long", fix="use a shorter name"
        )
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    for what, held in (("the current folder", cwd), ("your home folder", home)):
        if resolved == held or resolved in held.parents:
            raise InputError(
                f"--out {text} is {what} or a folder above it, which probekit would replace whole",
                fix="name a new folder for the output, e.g. --out report/",
            )
    for item in protect:
        if item is None or not str(item):
            continue
        held = Path(item).resolve()
        if resolved == held or resolved in held.parents:
            raise InputError(
                f"--out {text} holds {item}, an input that replacing the folder would delete",
                fix="write the output to a folder of its own, e.g. --out report/",
            )


def _check_parent_writable(text: str, resolved: Path) -> None:
    """Refuse an output folder that lies under a file or in a folder that cannot be written."""
    ancestor = resolved.parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(
            f"--out {text} lies under {ancestor}, which is a file, not a folder",
            fix="choose an output folder that is not below a file",
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(
            f"cannot create --out {text}: {ancestor} is not writable (read-only filesystem or no "
            "permission)",
            fix="choose an output folder you can write to",
        )


def check_out_dir(
    out: str | os.PathLike,
    *,
    force: bool = False,
    protect: Iterable[Any] = (),
    recognise: Callable[[Path], bool] = is_report_folder,
    what: str = "report",
) -> Path:
    """Check, before any work, that ``out`` can receive a folder of output swapped in whole
    (:func:`page_folder`).

    Refuses (:class:`~probekit.errors.InputError`) an empty or degenerate name; ``/``, the
    current or home folder or a folder above them; a folder holding one of ``protect`` (the
    checkpoint, the text); an existing file, pipe or dangling link; a path under a file or in an
    unwritable folder; and, unless ``force``, a non-empty folder that ``recognise`` does not
    take for probekit output of this kind (``what``). Returns ``out`` as a Path.

    This module imports nothing heavy, so a wrong ``--out`` is refused before the report's
    imports (torch, the analyses) load.

    Example:
        >>> import tempfile
        >>> check_out_dir(Path(tempfile.mkdtemp()) / "report").name
        'report'
    """
    text = os.fspath(out)
    if not text.strip() or "\0" in text:
        raise InputError(
            f"--out {text!r} is not a folder name", fix="name a folder, e.g. --out report/"
        )
    path = Path(text)
    resolved = path.resolve()
    _check_degenerate(text, resolved, protect)
    if os.path.lexists(path) and not path.is_dir():
        raise InputError(
            f"--out {text} exists and is not a folder (a file, pipe or dangling link)",
            fix="choose a new folder name, or delete the file",
        )
    _check_parent_writable(text, resolved)
    if path.is_dir() and not force:
        try:
            empty = not any(path.iterdir())
        except OSError as err:
            raise InputError(
                f"cannot read --out {text} ({err.strerror or err})",
                fix="choose an output folder you can read and write",
            ) from err
        if not empty and not recognise(path):
            raise InputError(
                f"--out {text} is a non-empty folder that holds no probekit {what}",
                fix="choose an empty or new folder, or pass --force to replace it whole "
                "(its files are deleted)",
            )
    return path


def chromium_available() -> bool:
    """Whether a Chrome/Chromium browser (which kaleido drives to draw PNG/SVG) is on the path.

    Example:
        >>> chromium_available() in (True, False)
        True
    """
    return any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome"))


def can_export_images() -> bool:
    """Whether :func:`export_figures` can run here: kaleido and a Chrome/Chromium are present."""
    import importlib.util

    return chromium_available() and importlib.util.find_spec("kaleido") is not None


def missing_for_images() -> str | None:
    """What PNG/SVG export lacks here, in words with the install command; ``None``: nothing.

    Example:
        >>> missing_for_images() is None or "install" in missing_for_images()
        True
    """
    import importlib.util

    lacks = []
    if importlib.util.find_spec("kaleido") is None:
        lacks.append('the kaleido package (pip install -e ".[png]", or pip install kaleido)')
    if not chromium_available():
        lacks.append("a Chrome/Chromium browser (e.g. apt-get install chromium)")
    return " and ".join(lacks) or None


def export_figures(figs: Mapping[str, go.Figure], out_dir: str | os.PathLike) -> list[Path]:
    """PNG and SVG copies ``<name>.png``, ``<name>.svg`` of every figure of ``figs``
    ({name: figure}; kaleido with a Chrome/Chromium), written atomically.

    All images are rendered in one browser session, each at its figure's own size, into a
    temporary folder inside ``out_dir`` and then renamed into place.
    """
    import tempfile

    from probekit import figures

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [f"{name}.{suffix}" for name in figs for suffix in ("png", "svg")]
    copies = [fig for fig in figs.values() for _ in ("png", "svg")]
    # each figure at its own size (kaleido renders at 700 x 500 unless told, clipping titles)
    with tempfile.TemporaryDirectory(dir=out, prefix=".images.") as tmp:
        figures.write_images(copies, [Path(tmp) / name for name in names])
        written = []
        for name in names:
            os.replace(Path(tmp) / name, out / name)
            written.append(out / name)
    return written


def export_or_warn(export: Callable[[], Any]) -> bool:
    """Run ``export`` (an image export); a failing renderer is one warning on stderr and
    False (the page's HTML figures stand). An OSError (disk full) is raised.

    Example:
        >>> export_or_warn(lambda: None)
        True
    """
    try:
        export()
    except OSError:
        raise
    except Exception as err:  # kaleido/Chromium raise many types; the HTML figures suffice
        message = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        print(f"probekit: warning: no PNG/SVG images ({message})", file=sys.stderr)
        return False
    return True


__all__ = [
    "STYLE",
    "can_export_images",
    "check_out_dir",
    "chromium_available",
    "export_figures",
    "export_or_warn",
    "figure_html",
    "figure_section",
    "is_report_folder",
    "missing_for_images",
    "html_page",
    "page_folder",
    "plotly_script",
    "side_by_side",
    "sub",
    "write_json",
]

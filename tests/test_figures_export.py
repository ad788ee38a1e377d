"""Issue 31 item 14: ``figures.write_image`` checks ``dpi`` and the path before it renders, a
clean-up never hides the real error, and a missing Chromium or kaleido is said in words."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from probekit import figures
from probekit.errors import InputError, ProbekitError

FIG = go.Figure(go.Bar(x=[0], y=[1]))


@pytest.fixture
def no_render(monkeypatch):
    """Fail the test if the renderer is reached: every case here is refused before it."""

    def render(*args, **kwargs):
        raise AssertionError("kaleido was called")

    monkeypatch.setattr(pio, "write_images", render)


@pytest.mark.parametrize("dpi", [0, -1, 1e9, math.nan, math.inf, "300", True, None, 49.9])
@pytest.mark.parametrize("preset", [None, "one-column"])
def test_a_bad_dpi_is_refused_before_rendering(dpi, preset, tmp_path, no_render):
    with pytest.raises(InputError, match=r"dpi .* not a number of dots per inch in \[50, 1200\]"):
        figures.write_image(FIG, tmp_path / "a.png", preset=preset, dpi=dpi)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("dpi", [50, 300, 1200, 600.0, np.int64(300)])
def test_a_good_dpi_reaches_the_renderer(dpi, tmp_path, monkeypatch):
    def render(figs, files, **kwargs):
        for file in files:
            Path(file).write_bytes(b"png")

    monkeypatch.setattr(pio, "write_images", render)
    assert figures.write_image(FIG, tmp_path / "a.png", preset="one-column", dpi=dpi).is_file()


@pytest.mark.parametrize(
    "name, match",
    [
        ("missing/a.png", "does not exist"),
        ("a_file/a.png", "is not a folder"),
        ("a_folder", "is a folder"),
        ("a_folder.png", "is a folder"),
        ("a.txt", "no image suffix"),
        ("a", "no image suffix"),
        ("a.png.", "no image suffix"),
    ],
)
def test_a_bad_path_is_refused_before_rendering(name, match, tmp_path, no_render):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_folder.png").mkdir()
    before = sorted(tmp_path.iterdir())
    with pytest.raises(InputError, match=match):
        figures.write_image(FIG, tmp_path / name)
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("path", [3, None, "", b"a.png"])
def test_a_path_that_is_no_file_name_is_refused(path, no_render):
    with pytest.raises(InputError, match="not a file name"):
        figures.write_image(FIG, path)


def test_one_path_per_figure(tmp_path, no_render):
    with pytest.raises(InputError, match="2 figures but 1 paths"):
        figures.write_images([FIG, FIG], [tmp_path / "a.png"])


def test_a_read_only_folder_is_refused_before_rendering(tmp_path, monkeypatch, no_render):
    monkeypatch.setattr(figures.os, "access", lambda path, mode: False)  # root writes anyway
    with pytest.raises(InputError, match="not writable"):
        figures.write_image(FIG, tmp_path / "a.pdf")


def test_the_clean_up_does_not_hide_the_real_error(tmp_path, monkeypatch):
    def render(figs, files, **kwargs):
        raise PermissionError(13, "Permission denied", files[0])

    def unlink(self, missing_ok=False):
        raise PermissionError(13, "Permission denied (clean-up)", str(self))

    monkeypatch.setattr(pio, "write_images", render)
    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(InputError, match=r"could not write .*a\.svg \(Permission denied\)"):
        figures.write_image(FIG, tmp_path / "a.svg")


def test_a_missing_chromium_is_said_as_the_reports_say_it(tmp_path, monkeypatch):
    from plotly.io._kaleido import PLOTLY_GET_CHROME_ERROR_MSG

    def render(*args, **kwargs):
        raise RuntimeError(PLOTLY_GET_CHROME_ERROR_MSG)  # what plotly raises without Chrome

    monkeypatch.setattr(pio, "write_images", render)
    with pytest.raises(ProbekitError, match="missing a Chrome/Chromium browser") as caught:
        figures.write_image(FIG, tmp_path / "a.png")
    assert "apt-get install chromium" in str(caught.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(importlib.util.find_spec("kaleido") is None, reason="needs kaleido")
def test_no_browser_where_kaleido_looks(tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", os.fspath(tmp_path / "no-such-chrome"))
    with pytest.raises(ProbekitError, match="missing a Chrome/Chromium browser"):
        figures.write_image(FIG, tmp_path / "a.png")
    assert not list(tmp_path.iterdir())


def test_a_missing_kaleido_is_named_with_its_install_command(tmp_path, monkeypatch, no_render):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "kaleido" else find_spec(name)
    )
    with pytest.raises(ProbekitError, match=r"missing the kaleido package.*pip install"):
        figures.write_image(FIG, tmp_path / "a.png")

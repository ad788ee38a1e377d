"""Open an HTML page in headless Chromium (Selenium with Debian's chromium and chromedriver) and
measure every plotly figure on it: what rendered, where its title is, what covers it, and
whether it fits its box on the page (a report section, a demo card) and the page."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

_MEASURE = """
const box = e => { if (!e) return null; const r = e.getBoundingClientRect();
  return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
return Array.from(document.querySelectorAll('.js-plotly-plot')).map(p => ({
  svg: box(p.querySelector('.main-svg')),
  title: box(p.querySelector('.gtitle')),
  title_text: (p.querySelector('.gtitle') || {}).textContent || '',
  toolbar: box(p.querySelector('.modebar')),
  plot_area: box(p.querySelector('.draglayer .nsewdrag')),
  container: box(p.closest('section, .card') || p.parentElement),
  page_width: document.documentElement.clientWidth,
  n_traces: (p.data || []).length,
  drawn: p.querySelectorAll('.trace, .hm, .heatmaplayer image').length,
}));
"""


def _driver() -> Any:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail('selenium is missing: pip install -e ".[dev]"')
    if not (chromium and driver):
        pytest.fail("Chromium or chromedriver is missing: apt-get install chromium chromium-driver")
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1300,1000"):
        options.add_argument(arg)
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def open_page(path: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The figures of the page at ``path`` (boxes in CSS pixels) and the browser's console
    errors, after the page and its scripts have loaded."""
    browser = _driver()
    try:
        browser.get(Path(path).resolve().as_uri())
        browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "if (document.readyState === 'complete') setTimeout(done, 300);"
            "else window.addEventListener('load', () => setTimeout(done, 300));"
        )
        figures = browser.execute_script(_MEASURE)
        errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        browser.quit()
    return figures, errors


def _overlaps(a: dict | None, b: dict | None) -> bool:
    if a is None or b is None:
        return False
    return not (
        a["right"] <= b["left"]
        or b["right"] <= a["left"]
        or a["bottom"] <= b["top"]
        or b["bottom"] <= a["top"]
    )


def _inside(inner: dict, outer: dict, slack: float = 0.5) -> bool:
    return (
        inner["left"] >= outer["left"] - slack
        and inner["right"] <= outer["right"] + slack
        and inner["top"] >= outer["top"] - slack
        and inner["bottom"] <= outer["bottom"] + slack
    )


def _inside_across(inner: dict, outer: dict, slack: float = 0.5) -> bool:
    """Whether ``inner`` lies within ``outer`` from left to right (a page box grows down)."""
    return inner["left"] >= outer["left"] - slack and inner["right"] <= outer["right"] + slack


def figure_problems(figures: list[dict[str, Any]]) -> list[str]:
    """What is wrong with the measured figures, one line each (empty: nothing)."""
    problems = []
    for i, fig in enumerate(figures):
        name = f"figure {i} ({fig['title_text'][:50]!r})"
        if fig["svg"] is None or fig["n_traces"] == 0 or fig["drawn"] == 0:
            problems.append(f"{name} did not render")
            continue
        if fig["svg"]["right"] > fig["page_width"] + 0.5:
            problems.append(f"{name}: wider than the page ({fig['svg']} past {fig['page_width']})")
        elif fig["container"] is not None and not _inside_across(fig["svg"], fig["container"]):
            problems.append(f"{name}: runs out of its box ({fig['svg']} not in {fig['container']})")
        if fig["title"] is None:
            continue  # a figure whose page heading carries its title
        if not _inside(fig["title"], fig["svg"]):
            problems.append(f"{name}: the title is clipped ({fig['title']} not in {fig['svg']})")
        if _overlaps(fig["title"], fig["toolbar"]):
            problems.append(f"{name}: the toolbar covers the title")
        if _overlaps(fig["title"], fig["plot_area"]):
            problems.append(f"{name}: the title runs into the plot area")
    return problems

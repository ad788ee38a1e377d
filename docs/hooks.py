"""MkDocs hooks: one home per text, seen from the site.

- The home page is the README itself (generated at build time, never copied into docs/).
- The notebooks (notebooks/*.ipynb, rendered by mkdocs-jupyter) and the figures (assets/) stay at
  the repository root and join the site's files under the same paths.
- ``<!-- include README.md:NAME -->`` in a page inserts the README's part between
  ``<!-- start:NAME -->`` and ``<!-- end:NAME -->`` (the install and test commands have one home).
- The tutorials are committed with their outputs (``execute: false``; regenerate them with
  ``python -m tests.notebook_outputs``): their figures are plotly divs drawn by the plotly.js that
  the plotly package ships, added once to the site and loaded by each tutorial page before them.
- Links are written for GitHub (``docs/x.md`` from the README, ``../assets/`` from docs/) and
  rewritten here for the site, where index.md, the pages, assets/ and notebooks/ share one root.
"""

from __future__ import annotations

import re
from pathlib import Path

import plotly
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from mkdocs.utils import get_relative_url

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
ROOT_FOLDERS = {"notebooks": "*.ipynb", "assets": "*.png"}
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
PLOTLY_JS_URI = "js/plotly.min.js"
INCLUDE = re.compile(r"<!-- include README\.md:([\w-]+) -->")


def readme_for_site(text: str) -> str:
    """README text with its links seen from the site's root (``docs/x.md`` -> ``x.md``)."""
    return text.replace("](docs/", "](")


def readme_part(name: str) -> str:
    """The README's text between ``<!-- start:NAME -->`` and ``<!-- end:NAME -->``."""
    text = README.read_text(encoding="utf-8")
    found = re.search(rf"<!-- start:{name} -->\n(.*?)<!-- end:{name} -->", text, re.DOTALL)
    if found is None:
        raise ValueError(f"README.md has no part {name!r} (<!-- start:{name} --> ... end)")
    return readme_for_site(found.group(1))


@event_priority(100)  # before mkdocs-jupyter turns the added notebooks into pages
def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the README as index.md and the root's notebooks and figures under their own paths."""
    files.append(
        File.generated(config, "index.md", content=readme_for_site(README.read_text("utf-8")))
    )
    for folder, pattern in ROOT_FOLDERS.items():
        for path in sorted((ROOT / folder).glob(pattern)):
            files.append(
                File(
                    f"{folder}/{path.name}",
                    src_dir=str(ROOT),
                    dest_dir=config.site_dir,
                    use_directory_urls=config.use_directory_urls,
                )
            )
    files.append(File.generated(config, PLOTLY_JS_URI, abs_src_path=str(PLOTLY_JS)))
    return files


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Load plotly.js at the top of a tutorial page, before the figures that it draws."""
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    src = get_relative_url(PLOTLY_JS_URI, page.url or ".")
    return f'<script src="{src}"></script>\n{html}'


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Insert the README's parts and point docs/'s ``../assets/`` links at the site's root."""
    markdown = INCLUDE.sub(lambda match: readme_part(match.group(1)), markdown)
    if "/" not in page.file.src_uri:  # a page at docs/'s top level: the root is one folder up
        markdown = markdown.replace("](../assets/", "](assets/")
        markdown = markdown.replace("](../notebooks/", "](notebooks/")
    return markdown

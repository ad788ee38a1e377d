"""The table of every ``probekit diagnose`` flag in docs/diagnose-a-checkpoint.md is the parser's
own (so it cannot go stale); rewrite it with ``python -m tests.test_flag_table``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from probekit.cli import build_parser
from probekit.cli.common import HelpFormatter

PAGE = Path(__file__).resolve().parent.parent / "docs" / "diagnose-a-checkpoint.md"
REWRITE = "python -m tests.test_flag_table"
START, END = f"<!-- flags:diagnose (generated: {REWRITE}) -->", "<!-- end flags -->"


def _cell(text: str) -> str:
    """Text that stays one Markdown table cell and reads as written."""
    text = " ".join(text.split()).replace("|", "\\|").replace("*", "\\*")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def flag_table(command: str = "diagnose") -> str:
    """The Markdown table of every flag of ``probekit COMMAND``: as typed, and its help (with
    the default, as ``--help`` shows it)."""
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    formatter = HelpFormatter(f"probekit {command}")
    rows = ["| flag | what it does |", "|---|---|"]
    for action in sub.choices[command]._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        typed = formatter._format_action_invocation(action)
        rows.append(f"| `{typed}` | {_cell(formatter._expand_help(action))} |")
    return "\n".join(rows) + "\n"


def _committed() -> str:
    text = PAGE.read_text(encoding="utf-8")
    found = re.search(re.escape(START) + r"\n\n(.*?)\n" + re.escape(END), text, re.DOTALL)
    assert found, f"{PAGE.name} has no {START} ... {END}"
    return found.group(1)


def test_the_diagnose_flag_table_is_the_parsers():
    assert _committed() == flag_table(), (
        f"the flag table in docs/{PAGE.name} differs from probekit diagnose's parser: "
        f"rewrite it with `{REWRITE}`"
    )


def test_every_flag_is_in_the_table():
    table = flag_table()
    for flag in ("--out", "--text", "--dataset", "--tuned-lens", "--threads", "--quiet"):
        assert f"`{flag}" in table, flag
    assert "--no-progress" not in table  # hidden flags stay hidden


def rewrite() -> None:
    """Put the parser's table between the markers of the page."""
    text = PAGE.read_text(encoding="utf-8")
    old = f"{START}\n\n{_committed()}\n{END}"
    PAGE.write_text(text.replace(old, f"{START}\n\n{flag_table()}\n{END}"), encoding="utf-8")


if __name__ == "__main__":
    rewrite()

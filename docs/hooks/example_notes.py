"""mkdocs hook: show readers whether an example runs in CI.

``tests/docs/test_examples.py`` runs the python blocks marked ``<!-- run ... -->`` and skips
those marked ``<!-- not run: REASON -->``. The markers are HTML comments, invisible on the page;
this hook adds a one-line note under each, so a reader knows which examples are checked and
why the others are not.
"""

from __future__ import annotations

import html
import re
from typing import Any

MARKER = re.compile(r"^([ \t]*)<!--\s*(?:run(?::[^>]*)?|not run:\s*(.+?))\s*-->[ \t]*$", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Follow each example marker with a short visible note."""
    return MARKER.sub(_note, markdown)


def _note(match: re.Match[str]) -> str:
    indent, reason = match.group(1), match.group(2)
    if reason is None:
        text = "This example runs in CI (tests/docs/test_examples.py)."
    else:
        text = f"Not run in CI: {html.escape(reason)}."
    return f'{match.group(0)}\n\n{indent}<p class="example-note"><small>{text}</small></p>'

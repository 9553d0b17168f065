"""MkDocs hook: render the Sphinx roles used in the package's docstrings.

Docstrings say ``:class:`~communicator.errors.RemoteError``` and ``:meth:`create```. mkdocstrings
shows such roles verbatim; this hook turns each into inline code that links to the object's entry
in the API reference when there is one (an optional cross-reference: no warning when there is not).
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|mod|attr|exc|data|obj):<code>(~?)([\w.]+)(?:\(\))?</code>")


def _replace(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    title = target.rsplit(".", 1)[-1] if short else target
    if "." not in target:
        return f"<code>{title}</code>"
    return f'<autoref identifier="{target}" optional><code>{title}</code></autoref>'


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub(_replace, html)

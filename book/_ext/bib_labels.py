"""Author-year labels in the references list, to match the author-year citations in the text.

The text cites "Elhage et al. (2021)" (``bibtex_reference_style: author_year``), but pybtex's
default ``alpha`` style labels the list itself with keys like ``[ENO+21a]``, which a reader cannot
match to the citation. This extension registers a pybtex style, ``author_year`` (set as
``bibtex_default_style`` in ``_config.yml``), that labels each entry "Elhage et al., 2021a": the
first author's last name ("A and B" for two authors, "A et al." for more) and the year, with a
letter when two entries would otherwise share a label. Entries are sorted as ``alpha`` sorts them.
"""

from __future__ import annotations

from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.alpha import Style as AlphaStyle
from pybtex.style.labels import BaseLabelStyle
from sphinx.application import Sphinx

STYLE = "author_year"


def _last_name(person) -> str:
    """A person's last name as plain text (BibTeX braces and accents resolved)."""
    return Text.from_latex(" ".join(person.prelast_names + person.last_names)).render_as("text")


def author_year(entry) -> str:
    """ "Rogozhnikov, 2022", "Nanda and Bloom, 2022" or "Elhage et al., 2021" (no suffix yet)."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_last_name(p) for p in people]
    if not names:
        who = entry.fields.get("title", entry.key)
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabels(BaseLabelStyle):
    """Author-year labels, with a, b, ... where two entries would share one."""

    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        base = [author_year(e) for e in entries]
        counts, seen = Counter(base), Counter()
        for label in base:
            if counts[label] > 1:
                seen[label] += 1
                yield f"{label}{chr(ord('a') + seen[label] - 1)}"
            else:
                yield label


class AuthorYearStyle(AlphaStyle):
    default_label_style = STYLE


def setup(app: Sphinx) -> dict:
    register_plugin("pybtex.style.labels", STYLE, AuthorYearLabels)
    register_plugin("pybtex.style.formatting", STYLE, AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

"""The book's references: what the text cites ("Elhage et al. [2021a]") is the list's label."""

import sys
from collections import Counter
from pathlib import Path

from pybtex.database import parse_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

from bib_labels import AuthorYearLabels, author_year  # noqa: E402


def test_every_citation_names_one_entry_and_matches_its_label():
    """The text's author-year citations come from the author and year fields alone, so no two
    entries may share them: two papers of one year carry their letter in the year (2021a, 2021b),
    and then the list's label is exactly the citation, with no letter added."""
    entries = list(parse_file(ROOT / "book" / "references.bib").entries.values())
    cited = [author_year(e) for e in entries]
    shared = [label for label, n in Counter(cited).items() if n > 1]
    assert not shared, f"entries cited alike: {shared}; give each a letter in its year (2021a, 2021b)"
    assert list(AuthorYearLabels().format_labels(entries)) == cited
    assert "Elhage et al., 2021a" in cited and "Elhage et al., 2021b" in cited


def test_labels_get_letters_when_two_entries_would_share_one():
    entries = list(parse_file(ROOT / "book" / "references.bib").entries.values())
    plain = next(e for e in entries if e.fields["year"].isdigit())
    labels = list(AuthorYearLabels().format_labels([plain, plain]))
    assert labels == [author_year(plain) + "a", author_year(plain) + "b"]

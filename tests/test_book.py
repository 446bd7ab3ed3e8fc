"""The book builds, with the project's own _config.yml, into a site that works offline.

One build of a smoke subset keeps this under a minute: every page of ``_toc.yml`` (chapter
notebooks are rendered but not executed here; ``make book`` and nbval execute them) plus a small
notebook made here that draws a figure, shows math, embeds a widget and an attention view,
executed by the build. The build runs with the Makefile's flags (``-W -n --keep-going``); the HTML
is then checked without trusting the build's own checks: no page or stylesheet loads anything from
another host, every page in the table of contents exists, every image and local script a page
loads exists, math is typeset by the local MathJax, widget state is rendered by the local embed
manager, the attention view answers a hovering pointer in Chromium, and chapter pages carry a
Colab launch button. Two cheap builds check the failure modes: a notebook that raises
and a missing offline asset.
"""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest
import yaml
from browser import CHROMIUM, Browser
from test_attention_view import check_states, hover_and_read

from attncircuits.show.widgets.attention import view_data

REPO = Path(__file__).resolve().parents[1]
JUPYTER_BOOK = Path(sys.executable).with_name("jupyter-book")
BUILD_FLAGS = ["-W", "-n", "--keep-going"]  # as in the Makefile's `book` target


def test_makefile_builds_with_warnings_as_errors():
    book_rule = re.search(r"^book:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert book_rule, "the Makefile has no `book` target"
    assert "jupyter-book build . " + " ".join(BUILD_FLAGS) in book_rule.group(1)


# ---- helpers -----------------------------------------------------------------------------------
class _Loads(HTMLParser):
    """Every URL an HTML page fetches while loading (not plain links), with the tag that loads it."""

    LINK_RELS = {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "preconnect", "dns-prefetch"}

    def __init__(self):
        super().__init__()
        self.loads: list[tuple[str, str]] = []  # (tag, url)
        self.scripts: list[dict] = []
        self.links: list[str] = []  # <a href>

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in {"script", "img", "iframe", "source", "embed", "audio", "video"} and a.get("src"):
            self.loads.append((tag, a["src"]))
        if tag == "link" and a.get("href") and self.LINK_RELS & set((a.get("rel") or "").lower().split()):
            self.loads.append((tag, a["href"]))
        if tag == "script":
            self.scripts.append(a)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])


def _pages(html_dir: Path) -> list[Path]:
    """The built pages (not the theme's template fragments under _static/)."""
    return sorted(p for p in html_dir.rglob("*.html") if "_static" not in p.relative_to(html_dir).parts)


def _parse(html_file: Path) -> _Loads:
    p = _Loads()
    p.feed(html_file.read_text(encoding="utf-8"))
    return p


def _external(url: str) -> bool:
    return bool(re.match(r"^\s*(https?:)?//", url, re.IGNORECASE))


def _local_target(html_file: Path, url: str) -> Path | None:
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or not parts.path:
        return None
    return (html_file.parent / unquote(parts.path)).resolve()


def _docnames(toc: dict) -> list[str]:
    """Every file of a jb-book table of contents (root, parts, chapters, sections)."""
    names = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                names.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [re.sub(r"\.(md|ipynb)$", "", n) for n in names]


def _smoke_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Smoke chapter\n\nThe direct path $W_U W_E$ and a display equation\n\n$$T = W_E W_U$$"),
        nbformat.v4.new_code_cell(
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(3, 2))\nax.plot([0, 1, 2], [2, 0, 1])\nplt.show()"
        ),
        nbformat.v4.new_code_cell("import ipywidgets as widgets\nwidgets.IntSlider(value=3, max=7, description='head')"),
        nbformat.v4.new_code_cell("assert 1 + 1 == 2", metadata={"tags": ["remove-input"]}),
        # the package's HTML tables, as the chapters display them (chapters 2 and 4)
        nbformat.v4.new_code_cell(
            "from IPython.display import display\n"
            "from attncircuits.show import plotting\n"
            "display(plotting.next_token_table_html(['·self', 'def'], {'weights': [[('.', 0.5)], [('·f', 0.2)]]}))\n"
            "display(plotting.skip_trigram_table_html([('0.1', '·self', '.', '_', 1.5)], "
            "['head', 'source', 'destination', 'output', 'score']))"
        ),
        # the attention view (chapters 3, 6, 7 and 12): markup, entities, quotes and a script's end
        # among its tokens; test_the_attention_view_responds_in_the_built_page hovers it
        nbformat.v4.new_code_cell(
            "import numpy as np\n"
            "from attncircuits.show.widgets import attention_view\n"
            "s = np.random.default_rng(0).random((3, 10, 10)) ** 3 * np.tri(10)\n"
            "tokens = ['<b>', '&amp;', '\"q\"', \"it's\", 'a\\nb', ' ', '</script>', '\\t', 'é→', 'x']\n"
            "attention_view(s / s.sum(-1, keepdims=True), tokens, selected=2)"
        ),
    ]
    return nb


def _source_tree(tmp: Path, toc: dict, config: dict | None = None) -> Path:
    """A build folder that sees the repository's pages through symlinks, with its own _toc.yml.

    ``config=None`` links the repository's _config.yml itself; a dict is written instead.
    """
    src = tmp / "src"
    src.mkdir()
    for name in ("book", "notebooks"):
        if (REPO / name).exists():
            (src / name).symlink_to(REPO / name)
    if config is None:
        (src / "_config.yml").symlink_to(REPO / "_config.yml")
    else:
        (src / "_config.yml").write_text(yaml.safe_dump(config))
    (src / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    return src


def _build(src: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    assert JUPYTER_BOOK.exists(), f"{JUPYTER_BOOK} not found: run `make venv` (installs jupyter-book)"
    return subprocess.run(
        [str(JUPYTER_BOOK), "build", str(src), "--path-output", str(src.parent / "out"), *BUILD_FLAGS],
        capture_output=True, text=True, timeout=timeout, cwd=src,
    )


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def _problems(log: str) -> str:
    """The build's warnings and errors first, then the end of its log."""
    lines = [ln for ln in log.splitlines() if re.search(r"WARNING|ERROR|Error", ln) and "IPKernelApp" not in ln]
    return "\n".join(lines) + "\n--- end of the log ---\n" + log[-3000:]


@pytest.fixture(scope="module")
def assets():
    """The offline assets, fetched by the Makefile from the npm registry (once; then a no-op)."""
    r = subprocess.run(["make", "-s", "book-assets"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"`make book-assets` failed:\n{r.stdout}\n{r.stderr}"
    return REPO / "book" / "_static" / "vendor"


@pytest.fixture(scope="module")
def smoke_site(tmp_path_factory, assets):
    """Build every page of _toc.yml plus an executed smoke notebook; return (html dir, toc)."""
    tmp = tmp_path_factory.mktemp("book")
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    toc.setdefault("parts", []).append({"caption": "Smoke", "chapters": [{"file": "smoke/smoke"}]})
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    # The only change to the project's configuration: its notebooks are rendered, not executed.
    config.setdefault("execute", {})["exclude_patterns"] = ["notebooks/*.ipynb", "book/*.ipynb"]
    src = _source_tree(tmp, toc, config)
    (src / "smoke").mkdir()
    nbformat.write(_smoke_notebook(), src / "smoke" / "smoke.ipynb")
    r = _build(src)
    log = _strip_ansi(r.stdout + r.stderr)
    assert r.returncode == 0, f"the book build failed:\n{_problems(log)}"
    return src.parent / "out" / "_build" / "html", toc


# ---- the site ----------------------------------------------------------------------------------
def test_no_page_or_stylesheet_loads_from_the_network(smoke_site):
    html_dir, _ = smoke_site
    pages = _pages(html_dir)
    assert len(pages) >= 5
    external = [(p.relative_to(html_dir), tag, url) for p in pages for tag, url in _parse(p).loads if _external(url)]
    assert not external, f"pages load from other hosts: {external}"
    css_external = [
        (c.relative_to(html_dir), m.group(0))
        for c in html_dir.rglob("*.css")
        for m in re.finditer(r"(@import|url\()\s*['\"]?\s*(https?:)?//[^'\")\s;]+", c.read_text(errors="replace"))
    ]
    assert not css_external, f"stylesheets load from other hosts: {css_external}"
    # thebe (live cells on a remote kernel) is off: its script, which would fetch thebe from a CDN
    # when started, and that CDN address are left out of the pages.
    thebe = [str(p.relative_to(html_dir)) for p in pages if "sphinx-thebe" in p.read_text() or "THEBE_JS_URL" in p.read_text()]
    assert not thebe, f"pages still carry sphinx-thebe's assets: {thebe}"


def test_every_toc_page_is_built(smoke_site):
    html_dir, toc = smoke_site
    missing = [d for d in _docnames(toc) if not (html_dir / f"{d}.html").is_file()]
    assert not missing, f"pages in _toc.yml with no HTML: {missing}"
    assert (html_dir / "index.html").is_file()


def test_every_image_script_and_stylesheet_a_page_loads_exists(smoke_site):
    html_dir, _ = smoke_site
    missing, n_images = [], 0
    for page in _pages(html_dir):
        for tag, url in _parse(page).loads:
            target = _local_target(page, url)
            if target is None:
                continue
            n_images += tag == "img"
            if not target.is_file():
                missing.append((str(page.relative_to(html_dir)), url))
    assert not missing, f"missing files: {missing}"
    assert n_images >= 1, "the smoke notebook's figure should be an <img> in the site"


def test_math_is_typeset_by_the_local_mathjax(smoke_site):
    html_dir, _ = smoke_site
    for page in ("book/notation.html", "smoke/smoke.html"):
        parsed = _parse(html_dir / page)
        mathjax = [s["src"] for s in parsed.scripts if "mathjax" in (s.get("src") or "").lower()]
        assert mathjax, f"{page} has math but no MathJax script"
        for src in mathjax:
            target = _local_target(html_dir / page, src)
            assert target is not None and target.is_file(), f"{page}: MathJax at {src} is not a local file"
            assert target.name == "tex-chtml.js"
        # MathJax loads its fonts and TeX extensions relative to its own script.
        fonts = target.parent / "output" / "chtml" / "fonts" / "woff-v2"
        assert any(fonts.glob("*.woff")), f"MathJax fonts missing in {fonts}"
        assert "math notranslate" in (html_dir / page).read_text()


def test_widget_state_is_rendered_by_the_local_embed_manager(smoke_site):
    html_dir, _ = smoke_site
    page = html_dir / "smoke" / "smoke.html"
    parsed = _parse(page)
    assert any(s.get("type") == "application/vnd.jupyter.widget-state+json" for s in parsed.scripts), (
        "the executed smoke notebook's widget state is not embedded in its page"
    )
    managers = [s["src"] for s in parsed.scripts if "html-manager" in (s.get("src") or "")]
    assert managers, "no ipywidgets embed manager on a page with widgets"
    for src in managers:
        target = _local_target(page, src)
        assert target is not None and target.is_file(), f"embed manager {src} is not a local file"
    assert "application/vnd.jupyter.widget-view+json" in page.read_text()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium) to load the page in")
def test_the_attention_view_responds_in_the_built_page(smoke_site):
    """The smoke chapter's attention view, as the build wrote it, loaded from file:// in headless
    Chromium: hovering a token, the "to" button and a head's panel change the text's shades to what
    the patterns stored in the page say (tests/test_attention_view.py checks them against the ones
    passed in)."""
    html_dir, _ = smoke_site
    page = html_dir / "smoke" / "smoke.html"
    data = view_data(page.read_text(encoding="utf-8"))
    assert data["tokens"][:3] == ["<b>", "&amp;", '"q"'] and data["tokens"][6] == "</script>"
    with Browser(width=1000) as b:
        states = hover_and_read(b, page)
    check_states(states, data["weights"], data["tokens"], selected=2)


def test_chapter_pages_have_a_colab_launch_button(smoke_site):
    html_dir, _ = smoke_site
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    repo_url = config["repository"]["url"].rstrip("/")
    org_repo = urlsplit(repo_url).path.strip("/")
    branch = config["repository"]["branch"]
    links = _parse(html_dir / "smoke" / "smoke.html").links
    expected = f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/smoke/smoke.ipynb"
    assert expected in links, f"no Colab link {expected} among {[u for u in links if 'colab' in u]}"


_TABLE = re.compile(r"<table\b.*?</table>", re.DOTALL | re.IGNORECASE)
_STYLE = re.compile(r"""\bstyle\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)


def table_colour_problems(page_html: str) -> list[str]:
    """What in a page's HTML tables would not follow the theme's light and dark modes.

    The theme swaps text and background colours between its modes. An inline style inside a table
    that sets a text colour but no background (or a background but no text colour) pairs a fixed
    colour with one the theme changes: pale pink token chips on light grey, dark text on a dark
    heading. A table in a cell output must also carry the ``dataframe`` class, which the theme
    styles in both modes (without it, dark mode puts the table on a light box of its own)."""
    problems = []
    for table in _TABLE.findall(page_html):
        opening = table[: table.index(">") + 1]
        classes = re.search(r"""class\s*=\s*["']([^"']*)""", opening)
        if "dataframe" not in (classes.group(1).split() if classes else []):
            problems.append(f"table without the theme's 'dataframe' class: {opening}")
        for m in _STYLE.finditer(table):
            style = (m.group(1) or m.group(2) or "").lower()
            props = {d.split(":", 1)[0].strip() for d in style.split(";") if ":" in d}
            text = "color" in props
            background = bool(props & {"background", "background-color"})
            if text != background:
                problems.append(f"sets {'a text colour' if text else 'a background'} alone: style=\"{style}\"")
    return problems


def test_the_table_colour_rule_catches_a_colour_without_its_pair():
    chip = '<table class="dataframe"><tr><td><code style="background:#eef1f5;padding:0 3px">·self</code></td></tr></table>'
    heading = '<table class="dataframe"><thead><tr><th style="color:#222">result</th></tr></thead></table>'
    plain = "<table><tr><td>1</td></tr></table>"
    paired = '<table class="dataframe"><tr><td style="color:var(--x,#222);background:var(--y,#fff)">a</td></tr></table>'
    assert len(table_colour_problems(chip)) == 1 and "background alone" in table_colour_problems(chip)[0]
    assert len(table_colour_problems(heading)) == 1 and "text colour alone" in table_colour_problems(heading)[0]
    assert table_colour_problems(plain) == ["table without the theme's 'dataframe' class: <table>"]
    assert table_colour_problems(paired) == []


def test_html_tables_follow_the_themes_colours(smoke_site):
    """Every HTML table of every built page (the smoke chapter displays the package's tables)."""
    html_dir, _ = smoke_site
    smoke = (html_dir / "smoke" / "smoke.html").read_text(encoding="utf-8")
    assert len(_TABLE.findall(smoke)) >= 2, "the smoke chapter's tables are not in its page"
    problems = {
        str(p.relative_to(html_dir)): table_colour_problems(p.read_text(encoding="utf-8"))
        for p in _pages(html_dir)
        if "cell_output" in p.read_text(encoding="utf-8")
    }
    assert not {k: v for k, v in problems.items() if v}, problems


def test_the_stylesheet_sets_text_and_background_colours_together():
    """A rule of book/_static/custom.css that sets one of the two leaves the other to the theme, which
    changes it between light and dark mode (the reproduces page's dark-on-dark headings)."""
    css = re.sub(r"/\*.*?\*/", "", (REPO / "book" / "_static" / "custom.css").read_text(), flags=re.DOTALL)
    lonely = []
    for selector, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        props = {d.split(":", 1)[0].strip() for d in body.split(";") if ":" in d}
        if ("color" in props) != bool(props & {"background", "background-color"}):
            lonely.append(selector.strip())
    assert not lonely, f"rules that set a text colour or a background alone: {lonely}"


def test_chapter_pages_offer_their_learner_notebook(smoke_site):
    """Beside "Open the exercises in Colab", each chapter page links its learner notebook, served by
    the site itself, and the Colab link names the configured repository."""
    html_dir, _ = smoke_site
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    org_repo = urlsplit(config["repository"]["url"].rstrip("/")).path.strip("/")
    learner = sorted((REPO / "notebooks" / "exercises").glob("*.ipynb"))
    assert len(learner) >= 9
    for nb in learner:
        page = html_dir / "notebooks" / f"{nb.stem}.html"
        text = page.read_text(encoding="utf-8")
        downloads = re.findall(r'<a class="[^"]*\breference download internal\b[^"]*" download="" href="([^"]+)"', text)
        mine = [u for u in downloads if unquote(u).endswith(f"/{nb.name}")]
        assert mine, f"{page.name} has no download link to its learner notebook {nb.name}: {downloads}"
        target = _local_target(page, mine[0])
        assert target is not None and target.read_bytes() == nb.read_bytes(), f"{mine[0]} is not {nb}"
        colab = f"https://colab.research.google.com/github/{org_repo}/blob/{config['repository']['branch']}/notebooks/exercises/{nb.name}"
        assert colab in _parse(page).links, f"{page.name}: no Colab link {colab}"


def test_figures_open_at_full_size(smoke_site):
    """A figure scaled to the column (a phone's 358 px) links to its own image file."""
    html_dir, _ = smoke_site
    page = html_dir / "smoke" / "smoke.html"
    links = re.findall(r'<a class="[^"]*figure-full-size[^"]*" href="([^"]+)"[^>]*>\s*<img', page.read_text())
    assert links, "the smoke chapter's figure is not a link to its image"
    assert all((t := _local_target(page, u)) is not None and t.is_file() for u in links), links


def test_solution_markers_stay_in_the_notebooks_but_not_in_the_pages(smoke_site):
    html_dir, _ = smoke_site
    chapters = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    marked = [nb for nb in chapters if "# BEGIN SOLUTION" in nb.read_text(encoding="utf-8")]
    assert len(marked) >= 9
    shown = [nb.stem for nb in marked if "SOLUTION" in (html_dir / "notebooks" / f"{nb.stem}.html").read_text()]
    assert not shown, f"pages that show the BEGIN/END SOLUTION lines: {shown}"
    page = (html_dir / "notebooks" / f"{marked[0].stem}.html").read_text()
    assert "tag_solution" in page, "the solutions themselves should still be in the page"


def _learner_ext():
    sys.path.insert(0, str(REPO / "book" / "_ext"))
    try:
        import learner_notebooks
    finally:
        sys.path.pop(0)
    return learner_notebooks


@pytest.mark.parametrize(
    "url, publish, notebook_repo, fails",
    [
        ("placeholder", "", "placeholder", None),  # a local build keeps the placeholder
        ("placeholder", "1", "placeholder", "not the published"),
        ("https://github.com/someone/course", "1", "https://github.com/someone/course", None),
        ("https://github.com/someone/course", "1", "placeholder", "name another repository"),
        ("https://gitlab.com/someone/course", "1", "https://gitlab.com/someone/course", "not the published"),
        ("https://github.com/someone/course", "0", "placeholder", None),  # 0: not for publication
    ],
)
def test_a_build_for_publication_checks_the_repository(tmp_path, monkeypatch, url, publish, notebook_repo, fails):
    from types import SimpleNamespace

    from sphinx.errors import ConfigError

    ext = _learner_ext()
    url = ext.PLACEHOLDER_REPOSITORY if url == "placeholder" else url
    notebook_repo = ext.PLACEHOLDER_REPOSITORY if notebook_repo == "placeholder" else notebook_repo
    (tmp_path / "notebooks" / "exercises").mkdir(parents=True)
    org_repo = notebook_repo.split("/", 3)[-1]
    (tmp_path / "notebooks" / "01_x.ipynb").write_text(f'"REPOSITORY = \\"{notebook_repo}\\"\n"')
    (tmp_path / "notebooks" / "exercises" / "01_x.ipynb").write_text(
        f"https://colab.research.google.com/github/{org_repo}/blob/main/notebooks/01_x.ipynb"
    )
    app = SimpleNamespace(config=SimpleNamespace(html_theme_options={"repository_url": url}), srcdir=str(tmp_path))
    monkeypatch.setenv(ext.PUBLISH_ENV, publish)
    if fails is None:
        ext._check_repository(app)
    else:
        with pytest.raises(ConfigError, match=fails):
            ext._check_repository(app)
    if publish == "1" and fails is None:  # a page that still says to clone the placeholder stops it too
        (tmp_path / "book").mkdir()
        (tmp_path / "book" / "setup.md").write_text(f"git clone {ext.PLACEHOLDER_REPOSITORY}.git\n")
        with pytest.raises(ConfigError, match=r"pages still name the placeholder .*: book/setup.md; make them name"):
            ext._check_repository(app)


# ---- failure modes ------------------------------------------------------------------------------
def test_a_notebook_that_raises_fails_the_build_naming_notebook_and_cell(tmp_path, assets):
    toc = {"format": "jb-book", "root": "smoke/index", "chapters": [{"file": "smoke/broken"}]}
    src = _source_tree(tmp_path, toc)  # the repository's _config.yml, unchanged
    (src / "smoke").mkdir()
    (src / "smoke" / "index.md").write_text("# Smoke\n\nA page.\n")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Broken"),
        nbformat.v4.new_code_cell("claimed = 2"),
        nbformat.v4.new_markdown_cell("The claim:"),
        nbformat.v4.new_code_cell("assert claimed == 3, 'the claim no longer holds'"),
    ]
    nbformat.write(nb, src / "smoke" / "broken.ipynb")
    r = _build(src)
    log = _strip_ansi(r.stdout + r.stderr)
    assert r.returncode != 0, "a notebook that raises must fail the build"
    assert "smoke/broken.ipynb: cell 3 (code cell 1, counting from 0) raised AssertionError: the claim no longer holds" in log, log[-4000:]
    assert "assert claimed == 3" in log  # the traceback shows the cell's code


def test_a_missing_offline_asset_stops_the_build_with_the_command_to_run(tmp_path, assets):
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    config["sphinx"]["config"]["mathjax_path"] = "vendor/not-fetched/tex-chtml.js"
    src = _source_tree(tmp_path, {"format": "jb-book", "root": "book/setup"}, config)
    r = _build(src, timeout=120)
    log = _strip_ansi(r.stdout + r.stderr)
    assert r.returncode != 0
    assert "MathJax is missing" in log and "Run `make book-assets`" in log and "`make venv` installs" in log, log[-3000:]


@pytest.mark.parametrize("npm, says", [
    ("npm-is-not-installed", "make book-assets: no npm at 'npm-is-not-installed'; run 'make venv'"),
    ("false", "make book-assets: 'false pack mathjax@3.2.2 @jupyter-widgets/html-manager@1.0.15' failed; "),
])
def test_book_assets_with_a_broken_npm_says_what_failed(tmp_path, npm, says):
    r = subprocess.run(
        ["make", "-s", "book-assets", f"VENDOR={tmp_path / 'vendor'}", f"NPM={npm}"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode != 0
    assert r.stderr.splitlines()[0].startswith(says), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no vendor, no vendor.tmp


def test_the_offline_scanner_flags_external_loads():
    sys.path.insert(0, str(REPO / "book" / "_ext"))
    try:
        from offline_assets import external_loads
    finally:
        sys.path.remove(str(REPO / "book" / "_ext"))
    html = (
        '<script src="https://cdn.example.org/x.js"></script><script src="_static/local.js"></script>'
        '<link rel="stylesheet" href="//fonts.example.org/css"><a href="https://example.org">a link</a>'
        "<style>@import url('https://fonts.example.org/f.css');</style>"
    )
    assert external_loads(html) == ["https://cdn.example.org/x.js", "//fonts.example.org/css", "https://fonts.example.org/f.css"]
    assert external_loads('<link rel="icon" href="_static/favicon.png"><img src="fig.png">') == []


def test_code_blocks_of_the_pages_fit_the_column():
    """Fenced code in book/*.md is held to the notebooks' line limit (tests/notebook_pages.py)."""
    from notebook_pages import LINE_LIMIT

    long_lines = []
    for page in sorted((REPO / "book").glob("*.md")):
        fenced = False
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
            elif fenced and len(line) > LINE_LIMIT:
                long_lines.append(f"{page.name}:{n} ({len(line)} characters)")
    assert not long_lines, f"code lines wider than the book's column: {long_lines}"

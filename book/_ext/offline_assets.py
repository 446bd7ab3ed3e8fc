"""Keep the built book offline: local MathJax and widget manager, and no third-party load.

The site must read correctly from ``file://`` with the network off. MathJax and the ipywidgets
embed manager are not committed; ``make book-assets`` brings them from the npm registry into
``book/_static/vendor/`` (git-ignored) with the npm of the virtual environment (Node.js from PyPI),
and ``_config.yml`` points at them. This extension

* stops the build, with the command to run, when those files have not been fetched, and
* after the build, warns (an error under ``-W``) for every page that would still load a script,
  stylesheet, font or frame from ``http(s)://`` when opened, and
* copies ``book/_static`` (the CSS, the fetched assets) into the site even when no page changed:
  Sphinx skips its static-file step when nothing is outdated, so a new stylesheet or a refetched
  MathJax would otherwise not reach ``_build/html`` until some page changed; and
* leaves out sphinx-thebe's script, stylesheet and CDN address from every page while thebe (live
  code cells on a remote kernel) is off, as it is in ``_config.yml``: Jupyter Book always loads
  the extension, but with no thebe button nothing would ever use them.
"""

from __future__ import annotations

import re
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ExtensionError
from sphinx.util import logging
from sphinx.util.fileutil import copy_asset
from sphinx.util.matching import Matcher

logger = logging.getLogger(__name__)

FETCH_COMMAND = "make book-assets"
NPM_INSTALL = "make venv"  # installs Node.js (and npm) from PyPI into .venv

# Tags whose attribute is fetched when the page loads (a plain <a href> is a link, not a load).
_LOADED = re.compile(
    r"<(?:script|img|iframe|source|embed|audio|video)\b[^>]*?\bsrc\s*=\s*[\"']?(https?:)?//[^\"'\s>]+"
    r"|<link\b(?=[^>]*\brel\s*=\s*[\"']?(?:stylesheet|preload|modulepreload|prefetch|preconnect|dns-prefetch|icon)\b)"
    r"[^>]*?\bhref\s*=\s*[\"']?(https?:)?//[^\"'\s>]+"
    r"|@import\s+(?:url\()?\s*[\"']?(https?:)?//[^\"')\s;]+"
    r"|url\(\s*[\"']?(https?:)?//[^\"')\s]+",
    re.IGNORECASE,
)
_URL = re.compile(r"(?:https?:)?//[^\"'\s>)]+")


def external_loads(html: str) -> list[str]:
    """URLs that a browser would fetch from another host while loading this HTML or CSS text."""
    return [_URL.search(m.group(0)).group(0) for m in _LOADED.finditer(html)]


def _is_url(path: str) -> bool:
    return bool(re.match(r"^(https?:)?//", path))


def _check_assets(app: Sphinx, config: Config) -> None:
    """Fail early, with the fix, if a locally served asset has not been fetched."""
    wanted = []
    if getattr(config, "mathjax_path", None):
        wanted.append(("MathJax", config.mathjax_path))
    for path in (getattr(config, "nb_ipywidgets_js", None) or {}).keys():
        wanted.append(("the ipywidgets embed manager", path))
    static_dirs = [Path(app.srcdir, p) for p in config.html_static_path]
    for what, path in wanted:
        if _is_url(path):
            raise ExtensionError(
                f"{what} would load from {path} at page load, so the book would not work offline. "
                f"Point _config.yml at the copy under book/_static/vendor/ (fetched by `{FETCH_COMMAND}`)."
            )
        if not any((d / path).is_file() for d in static_dirs):
            raise ExtensionError(
                f"{what} is missing: no {path} under {', '.join(str(d) for d in static_dirs)}. "
                f"Run `{FETCH_COMMAND}` to fetch it from the npm registry "
                f"(with the npm that `{NPM_INSTALL}` installs into .venv), then build again."
            )


def _note_page_written(app: Sphinx, *args) -> None:
    app._offline_assets_pages_written = True  # this build wrote a page


def _refresh_static(app: Sphinx) -> None:
    """Copy html_static_path into _static/ when Sphinx skipped it (no page was written)."""
    if getattr(app, "_offline_assets_pages_written", False):
        return
    excluded = Matcher([*app.config.exclude_patterns, "**/.*"])
    for entry in app.config.html_static_path:
        copy_asset(Path(app.confdir, entry), Path(app.outdir, "_static"), excluded)


def _scan_output(app: Sphinx, exception: Exception | None) -> None:
    """Warn for every built page or stylesheet that loads something from another host."""
    if exception is not None or app.builder is None or app.builder.format != "html":
        return
    _refresh_static(app)
    out = Path(app.outdir)
    for path in sorted(out.rglob("*.html")):
        for url in external_loads(path.read_text(encoding="utf-8", errors="replace")):
            logger.warning(f"{path.relative_to(out)} loads {url} at page load; the book must work offline")
    for path in sorted(out.rglob("*.css")):
        for url in external_loads(path.read_text(encoding="utf-8", errors="replace")):
            logger.warning(f"{path.relative_to(out)} loads {url}; the book must work offline")


def _thebe_enabled(config: Config) -> bool:
    launch = (config.html_theme_options or {}).get("launch_buttons") or {}
    thebe = getattr(config, "thebe_config", None)
    return bool(launch.get("thebe")) or (isinstance(thebe, dict) and bool(thebe.get("always_load")))


def _is_thebe_asset(asset) -> bool:
    name = Path(str(getattr(asset, "filename", "") or "")).name
    body = str((getattr(asset, "attributes", None) or {}).get("body", ""))
    return name.startswith("sphinx-thebe") or "THEBE_JS_URL" in body


def _drop_unused_thebe(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Remove thebe's assets from this page (Sphinx restores the lists after each page)."""
    if _thebe_enabled(app.config):
        return
    for key in ("script_files", "css_files"):
        files = context.get(key)
        if isinstance(files, list):
            files[:] = [f for f in files if not _is_thebe_asset(f)]


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _check_assets, priority=900)
    app.connect("html-page-context", _drop_unused_thebe, priority=900)
    app.connect("html-page-context", _note_page_written)
    app.connect("build-finished", _scan_output)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

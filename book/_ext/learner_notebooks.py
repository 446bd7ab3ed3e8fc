"""The learner's notebooks in the built book, and the one setting that says where the course lives.

Each chapter's "Open the exercises in Colab" link names the learner's notebook
(``notebooks/exercises/NN_*.ipynb``). In the built page this extension

- points that link at the repository of ``_config.yml`` (``repository.url`` and ``.branch``), so
  the configuration is the one place the pages take it from;
- puts a download link to the same learner notebook beside it, served from the site itself
  (Sphinx copies it into ``_downloads/``), so a reader of the static book, offline or before the
  course is published, gets the exercises too (the theme's download button offers the solved
  notebook);
- hides the ``# BEGIN SOLUTION`` / ``# END SOLUTION`` lines of the collapsed solutions; they stay in
  the notebooks, where ``python -m attncircuits.course.exercises.make_learner`` reads them.

``repository.url`` ships as a placeholder. A build says so in one line; with ``COURSE_PUBLISH=1``
in the environment (``make book PUBLISH=1``) it stops instead, and also stops when a notebook's
Colab set-up cell or Colab link names another repository than the configuration, or a page of
the book (or the README) still names the placeholder, as setup's ``git clone`` line does.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.errors import ConfigError
from sphinx.transforms import SphinxTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: What ``repository.url`` says until the course is published.
PLACEHOLDER_REPOSITORY = "https://github.com/transformer-circuits-from-scratch/course"
PUBLISH_ENV = "COURSE_PUBLISH"
LEARNER_DIR = "notebooks/exercises"
DOWNLOAD_TEXT = "Download the exercises notebook"
_COLAB = re.compile(
    r"^https://colab\.research\.google\.com/github/[^/]+/[^/]+/blob/[^/]+/" + LEARNER_DIR + r"/([\w.-]+\.ipynb)$"
)
_MARKER = re.compile(r"^[ \t]*# (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)
_NAMED_REPOSITORY = re.compile(r'REPOSITORY = "([^"]+)"|colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/')


def _repository(app: Sphinx) -> tuple[str, str]:
    options = app.config.html_theme_options or {}
    url = (options.get("repository_url") or "").rstrip("/")
    return url, options.get("repository_branch") or "main"


def _colab_url(app: Sphinx, name: str) -> str:
    url, branch = _repository(app)
    org_repo = url.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/{LEARNER_DIR}/{name}"


class LearnerNotebookLinks(SphinxTransform):
    """Beside each "Open the exercises in Colab" link: the configured repository, and a download."""

    default_priority = 400

    def apply(self, **kwargs) -> None:
        for ref in list(self.document.findall(nodes.reference)):
            match = _COLAB.match(ref.get("refuri", ""))
            if not match:
                continue
            name = match.group(1)
            ref["refuri"] = _colab_url(self.app, name)
            download = addnodes.download_reference(
                "", "", nodes.inline("", DOWNLOAD_TEXT), reftarget=f"/{LEARNER_DIR}/{name}",
                refdoc=self.env.docname, refexplicit=True, refdomain="", reftype="download",
            )
            download["classes"].append("learner-notebook-download")
            parent = ref.parent
            index = parent.index(ref)
            parent.insert(index + 1, nodes.Text(" or "))
            parent.insert(index + 2, download)


def _hide_solution_markers(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    for container in doctree.findall(nodes.container):
        if "tag_solution" not in container.get("classes", []):
            continue
        for block in container.findall(nodes.literal_block):
            text = block.astext()
            if _MARKER.search(text):
                block.children = [nodes.Text(_MARKER.sub("", text))]


def _check_repository(app: Sphinx) -> None:
    url, _ = _repository(app)
    publish = os.environ.get(PUBLISH_ENV, "") not in ("", "0")
    if not publish:
        if url == PLACEHOLDER_REPOSITORY:
            logger.info(f"local build: the Colab links name the placeholder repository {url} "
                        f"(set repository.url in _config.yml and build with {PUBLISH_ENV}=1 to publish)")
        return
    if url == PLACEHOLDER_REPOSITORY or not url.startswith("https://github.com/"):
        raise ConfigError(f"{PUBLISH_ENV}=1: repository.url in _config.yml is '{url}', not the published "
                          "GitHub repository; set it (and the notebooks' REPOSITORY lines) and build again")
    org_repo = url.removeprefix("https://github.com/")
    root = Path(app.srcdir)
    wrong = sorted(
        str(p.relative_to(root))
        for p in root.glob("notebooks/**/*.ipynb")
        for m in _NAMED_REPOSITORY.finditer(p.read_text(encoding="utf-8"))
        if (m.group(1) or "").rstrip("/") not in ("", url) or (m.group(2) or org_repo) != org_repo
    )
    if wrong:
        raise ConfigError(f"{PUBLISH_ENV}=1: these notebooks name another repository than {url}: "
                          f"{', '.join(dict.fromkeys(wrong))}; make them name it and build again")
    # the pages that tell a reader to clone or install the course name it too (setup's git clone)
    pages = sorted(str(p.relative_to(root)) for p in [*root.glob("book/**/*.md"), root / "README.md"]
                   if p.is_file() and PLACEHOLDER_REPOSITORY in p.read_text(encoding="utf-8"))
    if pages:
        raise ConfigError(f"{PUBLISH_ENV}=1: these pages still name the placeholder repository "
                          f"{PLACEHOLDER_REPOSITORY}: {', '.join(pages)}; make them name {url} and build again")


def setup(app: Sphinx) -> dict:
    app.add_transform(LearnerNotebookLinks)
    app.connect("builder-inited", _check_repository)
    app.connect("doctree-resolved", _hide_solution_markers)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

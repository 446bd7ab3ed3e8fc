"""Every figure a notebook draws opens at full size: the image becomes a link to its own file.

In the page a figure is scaled to the column (``max-width: 100%`` in custom.css): on a 390 px
phone a 1000 px figure shrinks to about a third and its tick labels to a few pixels. Following
the link shows the image alone, at its own size, where the phone's zoom works.
"""

from __future__ import annotations

import posixpath

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.osutil import relative_uri


def _link_figures(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    if app.builder.format != "html":
        return
    images = relative_uri(app.builder.get_target_uri(docname), "_images")
    for output in doctree.findall(nodes.container):
        if "cell_output" not in output.get("classes", []):
            continue
        for image in list(output.findall(nodes.image)):
            if isinstance(image.parent, nodes.reference):
                continue
            uri = image.get("candidates", {}).get("*", image["uri"])
            if "://" in uri or uri.startswith("data:"):
                continue
            link = nodes.reference("", "", internal=True, refuri=posixpath.join(images, posixpath.basename(uri)),
                                   classes=["figure-full-size"], reftitle="open the figure at full size")
            image.replace_self(link)
            link.append(image)


def setup(app: Sphinx) -> dict:
    app.connect("doctree-resolved", _link_figures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

"""Sphinx extension: links written in the Markdown that a notebook's code *outputs* work like the
ones in its prose.

myst-nb renders a cell's Markdown output (a computed table, a generated sentence) without
resolving its links, so ``[GPU reports](gpu_reports.md)`` or ``[4](04_loss_scaling.ipynb)`` would
point at a source file. Two hooks fix that:

* ``doctree-read``: an anchor a page's output creates, ``<span id="claim-fp16-range"></span>``
  (the claims ledger's rows), is registered as a target of that page, so that a chapter's prose can
  link to the row, ``[ledger](claims_ledger.ipynb#claim-fp16-range)``, and the build checks it
  (``-n``: a link to a missing row is an error);
* ``doctree-resolved``: a relative link to a page of the book (``.md`` or ``.ipynb``, with or
  without ``#anchor``) left in an output is rewritten to that page's HTML.
"""
import posixpath
import re
from urllib.parse import urlsplit

from docutils import nodes

ANCHOR = re.compile(r'<span id="(claim-[a-z0-9-]+)">')
PAGES = (".md", ".ipynb")


def _register_output_anchors(app, doctree) -> None:
    env = app.env
    slugs = env.metadata[env.docname].setdefault("myst_slugs", {})
    for raw in doctree.findall(nodes.raw):
        for anchor in ANCHOR.findall(raw.astext()):
            slugs[anchor] = (raw.line or 0, anchor, "claims ledger row")  # (line, id, link text)


def _resolve_output_links(app, doctree, docname) -> None:
    for ref in doctree.findall(nodes.reference):
        uri = ref.get("refuri", "")
        url = urlsplit(uri)
        if url.scheme or url.netloc or not url.path.endswith(PAGES):
            continue
        target = posixpath.normpath(posixpath.join(posixpath.dirname(docname), url.path))
        target = target.rsplit(".", 1)[0]
        if target not in app.env.found_docs:
            continue  # not a page of the book: left alone (the browser test reports broken links)
        ref["refuri"] = app.builder.get_relative_uri(docname, target) + (f"#{url.fragment}" if url.fragment else "")
        ref["internal"] = True  # styled as a link within the book, not an external one


def setup(app):
    app.connect("doctree-read", _register_output_anchors)
    app.connect("doctree-resolved", _resolve_output_links)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

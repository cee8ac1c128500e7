"""The built book as a reader gets it, checked offline.

In headless Chromium (tests/browser.py; skipped, with how to install it, where there is none) every
HTML page of the book must load, MathJax (vendored in book/_static/mathjax/, never a CDN) must
typeset every formula without an error and leave no raw LaTeX in the text, every image must
load, and nothing may be fetched from the network. Screenshots of the landing page and a chapter
at phone and desktop widths go to ``_build/screenshots/`` for a person to look at.

Without a browser: every Colab launch button opens the page's own notebook on the configured
repository; no solution code and no hidden test of the nbgrader sources in ``solutions/`` reaches
the built book; every internal link and #anchor resolves, and the external links are listed in
``_build/external_links.txt``, never fetched. The leak detector, the link checker and the page
checker are each shown to fail on a fabricated page.

All tests share the session's one build (``built_book`` in conftest.py); set
``MPCOURSE_BUILT_BOOK=<path>/_build/html`` to check an existing build instead of building.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from grader import fabricate  # the nbgrader sources' secret lines
from tests import browser

ROOT = Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
BUILD_ARTEFACTS = ROOT / "_build"
CHROMIUM = browser.find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason=f"no Chromium: {browser.INSTALL_HINT}")

LANDING_PAGE = TOC["root"] + ".html"
SCREENSHOT_CHAPTER = "book/04_loss_scaling.html"
VIEWPORTS = {"phone": (390, 844, True), "desktop": (1440, 900, False)}


def book_pages(html: Path) -> list[str]:
    """Every HTML page of the built book, as paths relative to the HTML folder."""
    return sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html")
                  if not p.relative_to(html).parts[0].startswith("_"))


# -- in the browser ------------------------------------------------------------------------------

# Runs in each page once it has loaded; returns the page's problems as a list of strings.
# Sphinx marks every formula with class "math" (its TeX between \( \) or \[ \]); MathJax replaces
# that TeX with an <mjx-container>. An error is an <merror> node, or an undefined macro, which
# MathJax's noundefined extension shows in red instead.
PAGE_CHECK = r"""
(async () => {
  const problems = [];
  const formulas = document.querySelectorAll('.math');
  if (formulas.length) {
    if (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
      problems.push(`${formulas.length} formulas, but MathJax did not load`);
    } else {
      await MathJax.startup.promise;
      for (const item of MathJax.startup.document.math) {
        const mml = MathJax.startup.toMML(item.root);
        if (/<merror|mathcolor="red"/.test(mml)) problems.push(`MathJax error in: ${item.math}`);
      }
      for (const f of formulas) {
        if (!f.querySelector('mjx-container'))
          problems.push(`formula not typeset: ${f.textContent.trim().slice(0, 80)}`);
      }
    }
  }
  for (const e of document.querySelectorAll('mjx-merror'))
    problems.push(`MathJax error: ${e.getAttribute('data-mjx-error') || e.textContent}`);
  // Raw LaTeX left in the text (code, which may hold any characters, excepted).
  const skip = 'pre, code, script, style, textarea, mjx-container, .highlight';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  // $...$ with a command, ^, _ or = inside: math that reached the page untypeset (a notebook's
  // Markdown output is rendered as GitHub Markdown, which has no math).
  const raw = /\\\(|\\\[|\$\$|\\begin\{|\$(?=[^$\s])[^$\n]*?(\\[A-Za-z]+|[\^_=])[^$\n]*\$/;
  for (let node; (node = walker.nextNode());) {
    if (raw.test(node.textContent) && !node.parentElement.closest(skip))
      problems.push(`raw LaTeX in the text: ${node.textContent.trim().slice(0, 80)}`);
  }
  for (const img of document.images) {
    img.loading = 'eager';
    if (!img.complete) await Promise.race([img.decode().catch(() => {}),
                                           new Promise(r => setTimeout(r, 10000))]);
    if (!img.naturalWidth) problems.push(`image not shown: ${img.getAttribute('src')}`);
  }
  await document.fonts.ready;
  return problems;
})()
"""


# jupyter-book 1.0.4 writes sphinx-thebe's configuration <script> twice into every page; the second
# copy fails on its `const`, the first has already set it. Harmless (live code is not enabled).
UPSTREAM_JS_ERRORS = ("Identifier 'THEBE_JS_URL' has already been declared",)


def visit(chromium: browser.Chromium, url: str) -> list[str]:
    """Open ``url`` and return its problems: load errors, failed or network requests, JS errors,
    and whatever PAGE_CHECK finds."""
    error = chromium.open(url)
    if error:
        return [f"does not load: {error}"]
    problems = chromium.evaluate(PAGE_CHECK)
    chromium.evaluate("0")  # let the events of late requests (fonts) arrive
    requested = {}
    for method, event in chromium.events:
        if method == "Network.requestWillBeSent":
            requested[event["requestId"]] = event["request"]["url"]
        elif method == "Network.loadingFailed" and not event.get("canceled"):
            what = requested.get(event["requestId"], "?")
            if event.get("blockedReason"):
                problems.append(f"fetches from the network (blocked): {what}")
            else:
                problems.append(f"failed to load {what}: {event['errorText']}")
        elif method == "Runtime.exceptionThrown":
            details = event["exceptionDetails"]
            error = details.get("exception", {}).get("description") or details["text"]
            if not any(known in error for known in UPSTREAM_JS_ERRORS):
                problems.append(f"JavaScript error: {error}")
    return problems


@pytest.fixture(scope="module")
def chromium():
    with browser.Chromium(CHROMIUM) as instance:
        yield instance


@needs_chromium
def test_every_page_loads_typesets_its_math_and_shows_its_images(built_book, chromium):
    pages = [page for page in book_pages(built_book)
             if not Page((built_book / page).read_text()).redirect]  # the link check covers those
    assert LANDING_PAGE in pages and SCREENSHOT_CHAPTER in pages
    problems = {page: found for page in pages
                if (found := visit(chromium, (built_book / page).as_uri()))}
    assert not problems, json.dumps(problems, indent=1)


@needs_chromium
def test_page_check_fails_on_a_broken_page(tmp_path, chromium):
    """The checks above can fail: bad TeX, an undefined macro, raw LaTeX, a missing image, a
    request to the network, a missing page. (It also shows the vendored MathJax works offline.)"""
    mathjax = (ROOT / "book/_static/mathjax/tex-mml-chtml.js").as_uri()
    page = tmp_path / "broken.html"
    page.write_text(r"""<html><head><script defer src="MATHJAX"></script></head><body>
        <p><span class="math">\(\frac{1}{2}\)</span> fine,
        <span class="math">\(x^2^3\)</span> a double exponent,
        <span class="math">\(x^{2\)</span> unbalanced (MathJax does not even find it),
        <span class="math">\(\notamacro{x}\)</span> undefined.</p>
        <p>A table cell the renderer left alone: $2^{-14} \times 3$</p>
        <p>A computed output, its command first: $\nabla L$ is larger</p>
        <img src="missing.png"><img src="https://example.com/remote.png"></body></html>"""
                    .replace("MATHJAX", mathjax))
    problems = "\n".join(visit(chromium, page.as_uri()))
    assert problems.count("MathJax error in") == 2, problems
    assert "formula not typeset: \\(x^{2\\)" in problems
    assert "raw LaTeX in the text: A table cell" in problems
    assert "raw LaTeX in the text: A computed output" in problems
    assert "image not shown: missing.png" in problems
    assert "failed to load" in problems and "missing.png" in problems
    assert "fetches from the network (blocked): https://example.com/remote.png" in problems
    assert "frac" not in problems  # the good formula is typeset
    assert visit(chromium, (tmp_path / "absent.html").as_uri())[0].startswith("does not load")


@needs_chromium
@pytest.mark.parametrize("page", [LANDING_PAGE, SCREENSHOT_CHAPTER])
@pytest.mark.parametrize("viewport", VIEWPORTS)
def test_screenshots_at_phone_and_desktop_width(built_book, chromium, page, viewport):
    """Saved to _build/screenshots/ (the chapter scrolled to its first figure); at phone width the
    page itself must not scroll sideways (wide tables and code scroll in their own boxes)."""
    width, height, mobile = VIEWPORTS[viewport]
    chromium.set_viewport(width, height, mobile)
    try:
        assert not visit(chromium, (built_book / page).as_uri())
        if page != LANDING_PAGE:
            chromium.evaluate("document.querySelector('.cell_output img')"
                              ".scrollIntoView({block: 'center'})")
        assert chromium.evaluate("document.documentElement.scrollWidth") <= width
        shot = BUILD_ARTEFACTS / "screenshots" / f"{Path(page).stem}-{viewport}.png"
        chromium.screenshot(shot)
        assert shot.read_bytes().startswith(b"\x89PNG")
    finally:
        chromium.call("Emulation.clearDeviceMetricsOverride")


# -- Colab buttons, solution leaks and links, from the HTML alone --------------------------------

class Page(HTMLParser):
    """What the checks need from one HTML page: its text, ids, links, Colab launch buttons, and
    where it redirects to (the book's index.html only sends the reader on to the landing page)."""

    LINKING = {"a": "href", "link": "href", "area": "href", "script": "src", "img": "src",
               "source": "src", "iframe": "src", "video": "src", "audio": "src", "embed": "src"}

    def __init__(self, text: str):
        super().__init__()
        self.chunks, self.ids, self.links, self.colab_buttons, self.redirect = [], set(), [], [], None
        self.feed(text)
        self.close()
        self.text = "".join(self.chunks)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.ids.update(v for k, v in attrs.items() if k == "id" or (tag == "a" and k == "name"))
        if (link := attrs.get(self.LINKING.get(tag, ""))) is not None:
            self.links.append(link)
        if tag == "a" and attrs.get("title") == "Launch on Colab":  # the theme's launch button
            self.colab_buttons.append(attrs.get("href"))
        if tag == "meta" and (attrs.get("http-equiv") or "").lower() == "refresh":
            self.redirect = (attrs.get("content") or "").partition("url=")[2]
            self.links.append(self.redirect)

    def handle_data(self, data):
        self.chunks.append(data)


def colab_url(notebook: str) -> str:
    repository = CONFIG["repository"]["url"].removeprefix("https://github.com/")
    return (f"{CONFIG['launch_buttons']['colab_url']}/github/{repository}/blob/"
            f"{CONFIG['repository']['branch']}/{notebook}")


def test_colab_launch_buttons_open_the_pages_own_notebook(built_book):
    """Each page made from a notebook (book/*.ipynb, exercises/<a>/<a>.ipynb) launches exactly
    that notebook on Colab; a page made from Markdown has no Colab launch button."""
    wrong, notebooks = {}, 0
    for page in book_pages(built_book):
        links = set(Page((built_book / page).read_text()).colab_buttons)
        source = Path(page).with_suffix(".ipynb")
        expected = {colab_url(source.as_posix())} if (ROOT / source).is_file() else set()
        notebooks += bool(expected)
        if links != expected:
            wrong[page] = {"expected": sorted(expected), "found": sorted(links)}
    assert notebooks, "no page made from a notebook"
    assert not wrong, json.dumps(wrong, indent=1)


# An nbgrader marker on a line of its own (`### BEGIN SOLUTION`); prose may name the markers.
MARKER = re.compile(r"\W*(BEGIN|END) (SOLUTION|HIDDEN TESTS)\W*")
DISTINCTIVE = 16  # characters: a shorter line (`return x`, `loss.backward()`) proves nothing


def normalise(text: str) -> str:
    return " ".join(text.split())


def notebook_lines(path: Path) -> set[str]:
    return {normalise(line) for cell in json.loads(path.read_text())["cells"]
            for line in "".join(cell["source"]).splitlines()}


def secret_lines(solutions: Path, public: list[Path]) -> set[str]:
    """The distinctive lines of solution code and hidden tests in the nbgrader sources.

    Secret: code between BEGIN/END SOLUTION and between BEGIN/END HIDDEN TESTS in solution or
    graded cells, and the whole of a solution cell without markers (nbgrader replaces all of it).
    Distinctive: at least DISTINCTIVE characters, and in none of the ``public`` sources (the
    released exercises, the book's own pages), which the book may show.
    """
    secret = {normalise(line) for notebook in sorted(solutions.glob("*/*.ipynb"))
              for cell in json.loads(notebook.read_text())["cells"]
              for line in fabricate.split_cell(cell)[1]}
    known = set()
    for path in public:
        known |= notebook_lines(path) if path.suffix == ".ipynb" else {
            normalise(line) for line in path.read_text().splitlines()}
    return {line for line in secret if len(line) >= DISTINCTIVE and line not in known}


def leaks(html: Path, secrets: set[str]) -> dict[str, list[str]]:
    """nbgrader markers and secret lines in the built pages and copied sources, per file.

    A page is searched line by line, as its text (code highlighting splits a line of code into
    many tags) and as it is. Whole lines, because a short secret line may well be part of a longer
    public one, and a marker named in a sentence (the instructor guide's) is no leak.
    """
    found = {}
    for path in sorted(html.rglob("*")):
        if path.suffix not in (".html", ".ipynb", ".md", ".txt", ".py") or "_static" in path.parts:
            continue
        raw = path.read_text(errors="replace")
        text = Page(raw).text if path.suffix == ".html" else raw
        if path.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in json.loads(raw)["cells"])
        lines = {normalise(line) for line in (text + "\n" + raw).splitlines()}
        hits = sorted(line for line in lines if MARKER.fullmatch(line)) + sorted(secrets & lines)
        if hits:
            found[path.relative_to(html).as_posix()] = hits
    return found


def public_sources() -> list[Path]:
    """What the book may show: the released exercises, its own pages, the library's code."""
    return sorted([*ROOT.glob("exercises/**/*.ipynb"), *ROOT.glob("book/*.ipynb"),
                   *ROOT.glob("book/*.md"), *ROOT.glob("mpcourse/**/*.py")])


def test_no_solution_code_or_hidden_tests_in_the_built_book(built_book):
    secrets = secret_lines(ROOT / "solutions", public_sources())
    found = leaks(built_book, secrets)
    assert not found, "solutions leak into the book:\n" + json.dumps(found, indent=1)


def nbgrader_cell(source: str, **nbgrader) -> dict:
    return {"cell_type": "code", "source": source.splitlines(keepends=True),
            "metadata": {"nbgrader": nbgrader}, "outputs": [], "execution_count": None}


def write_notebook(path: Path, cells: list[dict]) -> Path:
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def test_the_leak_detector_finds_solution_code_and_hidden_tests(tmp_path):
    """On fabricated sources and pages: the detector can fail, and ignores what is public."""
    write_notebook(tmp_path / "solutions/ex1/ex1.ipynb", [
        nbgrader_cell("def scale(x):\n    ### BEGIN SOLUTION\n"
                      "    scaled_value = x * 2.0 ** exponent_bits\n"
                      "    return scaled\n    ### END SOLUTION\n", solution=True),
        nbgrader_cell("assert scale(1.0) == 256.0\n### BEGIN HIDDEN TESTS\n"
                      "assert scale(float('inf')) == float('inf')\n### END HIDDEN TESTS\n",
                      grade=True, points=1)])
    released = write_notebook(tmp_path / "exercises/ex1/ex1.ipynb", [
        nbgrader_cell("def scale(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"),
        nbgrader_cell("assert scale(1.0) == 256.0\n")])
    secrets = secret_lines(tmp_path / "solutions", [released])
    assert secrets == {"scaled_value = x * 2.0 ** exponent_bits",
                       "assert scale(float('inf')) == float('inf')"}
    html = tmp_path / "html"
    html.mkdir()
    # As Pygments writes code: one line split over many tags.
    (html / "leaky.html").write_text(
        '<pre><span class="n">scaled_value</span><span class="w"> </span><span class="o">=</span>'
        '<span class="w"> </span><span class="n">x</span> <span class="o">*</span> '
        '<span class="mf">2.0</span> <span class="o">**</span> <span class="n">exponent_bits</span>'
        '</pre>')
    (html / "marker.html").write_text("<pre>### BEGIN HIDDEN TESTS</pre>")
    (html / "clean.html").write_text("<pre>assert scale(1.0) == 256.0\nreturn scaled</pre>\n<p>Hidden"
                                     " tests go after <code>### BEGIN HIDDEN TESTS</code>.</p>")
    assert leaks(html, secrets) == {
        "leaky.html": ["scaled_value = x * 2.0 ** exponent_bits"],
        "marker.html": ["### BEGIN HIDDEN TESTS"]}


def check_links(html: Path) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """Broken internal links per page, and every external link with the pages that use it.

    Internal: a relative href/src must name a file inside the built book (a folder: its
    index.html), and a #fragment must be an id (or <a name>) on the target page.
    """
    html = html.resolve()
    parsed, broken, external = {}, defaultdict(list), defaultdict(set)

    def page(path: Path) -> Page:
        if path not in parsed:
            parsed[path] = Page(path.read_text(errors="replace"))
        return parsed[path]

    for name in book_pages(html):
        source = html / name
        for link in page(source).links:
            url = urlsplit(link)
            if url.scheme in ("data", "javascript"):
                continue
            if url.scheme or url.netloc:
                external[link].add(name)
                continue
            target = (source.parent / unquote(url.path)).resolve() if url.path else source
            if target.is_dir():
                target /= "index.html"
            if not target.is_relative_to(html) or not target.is_file():
                broken[name].append(f"{link}: no such file")
            elif url.fragment and target.suffix == ".html" and (
                    unquote(url.fragment) not in page(target).ids):
                broken[name].append(f"{link}: no #{url.fragment} on {target.name}")
    return dict(broken), dict(external)


def test_internal_links_resolve_and_external_links_are_listed(built_book):
    broken, external = check_links(built_book)
    BUILD_ARTEFACTS.mkdir(exist_ok=True)
    (BUILD_ARTEFACTS / "external_links.txt").write_text(
        "".join(f"{url}\t{', '.join(sorted(pages))}\n" for url, pages in sorted(external.items())))
    assert not broken, json.dumps(broken, indent=1)
    assert CONFIG["repository"]["url"] in external  # the repository button, listed not fetched


def test_the_link_checker_finds_broken_links(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text('<h1 id="top">Book</h1><a href="#top">ok</a>'
                                         '<a href="sub/">ok</a><a href="sub/index.html#part">ok</a>')
    (tmp_path / "sub/index.html").write_text(
        '<a name="part"></a><img src="../gone.png"><a href="../index.html#nowhere">x</a>'
        '<a href="../../outside.html">x</a><a href="https://example.com/a">x</a>'
        '<a href="mailto:someone@example.com">x</a><img src="data:image/png;base64,AAAA">')
    broken, external = check_links(tmp_path)
    assert broken == {"sub/index.html": ["../gone.png: no such file",
                                         "../index.html#nowhere: no #nowhere on index.html",
                                         "../../outside.html: no such file"]}
    assert external == {"https://example.com/a": {"sub/index.html"},
                        "mailto:someone@example.com": {"sub/index.html"}}

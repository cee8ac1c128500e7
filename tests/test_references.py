"""The book's references hold together: every BibTeX entry is cited and every citation has an
entry, every {term} names a glossary entry, every {numref} a named figure and every {eq} a
labelled equation. (The Sphinx build checks the same under -W -n, but only in a full build.)"""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"


def book_markdown() -> dict[str, str]:
    """The Markdown of every page: .md files, and the markdown cells of the notebooks."""
    pages = {p.name: p.read_text() for p in BOOK.glob("*.md")}
    for nb in BOOK.glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        pages[nb.name] = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return pages


def role_targets(role: str) -> list[str]:
    """Targets of {role}`text <target>` or {role}`target` across the book (comma-separated for cite)."""
    found = []
    for text in book_markdown().values():
        for body in re.findall(r"\{" + role + r"\}`([^`]+)`", text):
            target = re.search(r"<([^>]+)>$", body)
            found += [t.strip() for t in (target.group(1) if target else body).split(",")]
    return found


def bib_keys() -> list[str]:
    return re.findall(r"^@\w+\{([^,\s]+),", (BOOK / "references.bib").read_text(), re.M)


def test_bib_keys_are_unique():
    keys = bib_keys()
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_every_bib_entry_closes_its_braces_before_the_next_one():
    """A merge that drops one closing brace swallows the next entry without any error here."""
    text = (BOOK / "references.bib").read_text()
    entries = re.split(r"^(?=@\w+\{)", text, flags=re.M)[1:]
    unbalanced = [entry.split(",", 1)[0] for entry in entries
                  if entry.count("{") != entry.count("}")]
    assert not unbalanced, unbalanced


def test_every_entry_is_cited_and_every_citation_has_an_entry():
    cited = set(role_targets(r"cite(?::[pt])?"))
    keys = set(bib_keys())
    assert keys - cited == set(), f"entries never cited: {sorted(keys - cited)}"
    assert cited - keys == set(), f"citations without an entry: {sorted(cited - keys)}"


def test_every_term_reference_names_a_glossary_entry():
    glossary = (BOOK / "glossary.md").read_text()
    body = glossary.split("```{glossary}")[1].split("\n```")[0]
    terms = {line.strip().lower() for line in body.splitlines()
             if line and not line.startswith((" ", ":"))}
    missing = {t for t in role_targets("term") if t.lower() not in terms}
    assert not missing, f"{{term}} targets missing from the glossary: {sorted(missing)}"


def test_every_numref_names_a_figure_and_every_eq_a_label():
    figures = set()
    for nb in BOOK.glob("*.ipynb"):
        for cell in json.loads(nb.read_text())["cells"]:
            figure = cell["metadata"].get("mystnb", {}).get("figure")
            if figure:
                assert figure["name"] not in figures, f"figure name used twice: {figure['name']}"
                figures.add(figure["name"])
    labels = set()
    for text in book_markdown().values():
        labels |= set(re.findall(r"\$\$ \(([^)]+)\)", text))
    assert set(role_targets("numref")) <= figures, sorted(set(role_targets("numref")) - figures)
    assert set(role_targets("eq")) <= labels, sorted(set(role_targets("eq")) - labels)
    assert figures <= set(role_targets("numref")), f"figures never referenced: {sorted(figures - set(role_targets('numref')))}"
    assert labels <= set(role_targets("eq")), f"equations never referenced: {sorted(labels - set(role_targets('eq')))}"


def test_every_chapter_ends_with_takeaways_and_questions():
    for nb in sorted(BOOK.glob("[0-9][0-9]_*.ipynb")):
        text = book_markdown()[nb.name]
        assert "## Key takeaways" in text and "## Check your understanding" in text, nb.name
        assert text.index("## Key takeaways") < text.index("## Check your understanding"), nb.name


def test_sources_are_described_not_called_ours():
    """A reader cannot see "our sources": each source is named as what it is (a textbook chapter,
    a popular blog post, ...), in the book and in the exercises alike."""
    pages = book_markdown()
    for nb in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        pages[nb.name] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    wording = re.compile(r"\bour (source|sources|source texts?)\b|\bone of (our|the course's) sources\b", re.I)
    found = {name: wording.findall(text) for name, text in pages.items() if wording.search(text)}
    assert not found, found

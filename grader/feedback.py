"""The feedback a student gets back. Never runs student code: the notebook is rebuilt from data,
the notebook as run that came back from the feedback run's sandbox (grader/runs.py).

    feedback_notebook(ran, release, points, verdicts) -> the notebook nbgrader renders
    feedback_for(course, assignment, students, url) -> {student: why no page}  # nbgrader's HTML pages
    pack_feedback(course, assignment, out)            # each page named for upload to an LMS

The notebook: outputs reduced to text and checked images within OUTPUT_CHARS, Markdown made inert,
test cells as released with the verdict and a failure message fit to show (capped, the secret,
seeds and hidden-test lines withheld); grader/feedback_page.py says how the verdict and the maths
read.
"""
import contextlib
import hashlib
import json
import re
import shutil
import sys
import zipfile
from pathlib import Path

from grader import feedback_page
from grader.course import ROOT, in_process
from grader.notebooks import grade_id, normalised, part_of, source_text
from grader.report import CUT, NOTE, one_line, plural, shortened

OUTPUT_CHARS = 1_000_000          # the feedback's outputs, all cells together
# The student's own text in the feedback page: nbgrader renders it outside every sandbox and limit,
# and 10 MB of Markdown (`*_*_...`) took its renderer past 3.9 GB (red team 45d, A04). A completed
# notebook (the solutions) holds at most 42,906 characters, 8,672 in a cell (tests/test_instructor.py
# keeps these limits at twice that or more). Code is highlighted
# and the page parsed again in the grader's process too: 300,000 characters of one-character tokens
# (`a.a.a...`) in added cells took 13 s and 0.8 GB there, a student (red team 25, A4).
SOURCE_CHARS = 20_000             # one cell's source
SOURCE_TOTAL = 100_000            # all cells' sources together
MESSAGE_CHARS = 300               # a failure message in the feedback, the grader's note aside
IMAGE = re.compile(r"^[A-Za-z0-9+/=\s]*$")
# Under the output of the summary cell (`grading.summary()`), a tick per part that passed its
# visible tests in the run, right below a lower score (student walkthrough 48f, confusion 1): the
# grader's own line after it, the student's output left as it is.
SUMMARY_NOTE = ("[grader] The ticks above are the visible tests of this run of "
                "your notebook, not the grade. The points of each part are under its test cell, and in the score "
                "at the top of this page.\n")


# A URL scheme that runs code or embeds a document, even with blanks or control characters
# between its letters (browsers drop them).
DANGEROUS_SCHEME = re.compile("(?i)(" + "|".join(r"[\s\x00-\x1f]*".join(word) for word in
                                                 ("javascript", "vbscript", "data", "livescript")) + r")[\s\x00-\x1f]*:")
LINK_SYNTAX = re.compile(r"\](\s*)([(\[:])")  # [text](address), [text][ref], [ref]: address
MATH_LINKS = re.compile(r"\\(href|url|class|cssId|style|data|unicode|require)\b")
# A bare address (`https://...`), which the Markdown renderer turns into a link by itself (red team
# 26, A04): a zero-width space between the slashes of every `://` keeps the text and breaks the link.
# Found as a plain string, not as a scheme by a pattern: a pattern for the scheme before it took
# time quadratic in a cell of `a.a.a.` (red team 27, A04: 2.5 s a 20,000-character cell).
BARE_ADDRESS = "://"
# A run of emphasis characters: the renderer's emphasis parsing takes time quadratic in runs of
# 45-80 `*` before a letter (red team 26, A08: five cells of them, 20-30 s of the grader's process
# a student); escaped, each renders as itself.
EMPHASIS_RUN = re.compile(r"[*_]{4,}")


def inert_markdown(text: str) -> str:
    """Markdown that renders as text, not HTML: `&` and `<` escaped where they could start an entity
    or a tag, maths as plain text where it can be (grader/feedback_page.py), no link or image (their
    syntax broken: the Markdown renderer decodes entities in addresses, even escaped ones, so an
    address cannot be made safe by escaping), dangerous URL schemes broken in the text too,
    MathJax's link commands disabled, bare addresses not linked, runs of four or more `*` or `_`
    escaped (each shows as itself)."""
    text = feedback_page.escape_markup(feedback_page.readable_maths(text))
    text = LINK_SYNTAX.sub(lambda m: "]" + m.group(1) + "\\" + m.group(2), text)
    text = DANGEROUS_SCHEME.sub(lambda m: re.sub(r"[\s\x00-\x1f]", "", m.group(1)) + "-blocked:", text)
    text = text.replace(BARE_ADDRESS, ":/\u200b/")
    text = EMPHASIS_RUN.sub(lambda m: "".join("\\" + c for c in m.group()), text)
    return MATH_LINKS.sub(lambda m: f"\\text{{{m.group(1)}-blocked}}", text)


HEX_RUN = re.compile(r"[0-9a-fA-F]{16,}")


def withheld_run(match: re.Match) -> str:
    """A run of 16 or more hexadecimal digits, withheld, but a float's fraction (at most 17
    significant decimal digits after a point: `2.3025850929940455`, `0.0033333333333333335`, how
    Python prints a float near another, reviews 54-p and 55-p); an integer's digits are withheld
    (`int(secret, 16)` prints 77 of them)."""
    run, before, after = match.group(), match.string[match.start() - 1:match.start()], match.string[match.end():match.end() + 1]
    digits = run[:-1] if run[-1] in "eE" and after in ("+", "-") else run  # 1.2345678901234567e-05
    return run if before == "." and digits.isdigit() and len(digits.lstrip("0")) <= 17 else "(withheld)"


def safe_message(message: str, *, secrets: list[str], hidden_lines: set[str]) -> str:
    """A failure message fit for the student's feedback: capped (grader/report.py, `shortened`: the
    runner's text cut, the grader's note kept), without the secret (nor a seed drawn from it), and
    withheld whole if it quotes a line of the hidden tests."""
    text = str(message)
    if any(line in text for line in hidden_lines):
        return "(the message quotes the hidden tests: withheld, your instructor can see it)"
    for secret in secrets:
        if secret and secret in text:  # a seed only as a number of its own, not inside another
            text = re.sub(rf"(?<![0-9]){secret}(?![0-9])" if secret.isdigit() else re.escape(secret), "(withheld)", text)
    text = HEX_RUN.sub(withheld_run, text)  # a secret's fragment, hashed or not
    text, found, note = text.rpartition(NOTE)
    if not found:
        text, note = note, ""
    lines = text.splitlines()
    text = "\n".join(lines[:4]) + (CUT if len(lines) > 4 else "")
    return shortened(f"{text}{NOTE}{note}" if found else text, MESSAGE_CHARS)


def hidden_test_lines(source: dict) -> set[str]:
    """The lines of the hidden tests that students never see (repeated public lines excepted)."""
    hidden, public = set(), set()
    for cell in source["cells"]:
        inside = False
        for line in source_text(cell).splitlines():
            stripped = line.strip()
            if "### BEGIN HIDDEN TESTS" in line or "### BEGIN SOLUTION" in line:
                inside = True
            elif "### END HIDDEN TESTS" in line or "### END SOLUTION" in line:
                inside = False
            elif inside and (cell.get("metadata", {}).get("nbgrader", {}) or {}).get("grade"):
                hidden.add(stripped)
            elif not inside:
                public.add(stripped)
    return {line for line in hidden - public if len(line) >= 12}


def seeds_of(secret: str, count: int = 1000) -> list[str]:
    """The seeds `mpcourse.grading.seed(n)` draws from `secret`, for n < count, as text."""
    return [str(int.from_bytes(hashlib.sha256(f"{secret}:{n}".encode()).digest()[:4], "little") % 2**31)
            for n in range(count)]


# Where the grading machine keeps Python and the course: shown as "..." in the outputs a student gets
# back (a traceback's file names, a warning's), longest first (the environment may sit in the course).
MACHINE_PATHS = sorted({str(p) for p in (sys.prefix, sys.base_prefix, ROOT)}, key=len, reverse=True)


def without_machine_paths(text: str) -> str:
    for path in MACHINE_PATHS:
        text = text.replace(path + "/", ".../")
    return text


def execution_count(cell: dict) -> int | None:
    """The count the feedback run gave the cell (data from the sandbox: a plain small integer, else none)."""
    count = cell.get("execution_count")
    return count if type(count) is int and 0 < count < 1_000_000 else None


def untouched_parts(ran: dict, release: dict) -> set[str]:
    """The parts whose every answer cell is still as handed out (not attempted)."""
    answers = {grade_id(c): source_text(c).strip() for c in release["cells"]
               if (c.get("metadata", {}).get("nbgrader") or {}).get("solution") and grade_id(c)}
    submitted = {}
    for cell in ran["cells"]:
        if grade_id(cell) in answers:
            submitted.setdefault(grade_id(cell), []).append(source_text(cell).strip())
    parts = {part_of(g) for g in answers}
    return {p for p in parts if all(submitted.get(g, [a]) == [a] for g, a in answers.items() if part_of(g) == p)}


# A terminal escape sequence longer than any colour or style's: nbconvert's ansi2html, which renders
# the feedback page in the grader's own process, takes time quadratic in its parameters (red team 24:
# one sequence of 980,000 characters, within the output cap, held the grader 24 s). Whatever stands
# between `ESC[` and the final byte counts, as nbconvert reads it (`\x1b\[(.*?)([@-~])`): red team 25
# put blanks between the numbers.
LONG_ESCAPE = re.compile(r"\x1b\[[^@-~]{33,}[@-~]?")


def shown(text: str) -> str:
    """An output's text as the feedback shows it: no machine path, no overlong escape sequence."""
    return LONG_ESCAPE.sub("", without_machine_paths(text))


def safe_outputs(outputs) -> list[dict]:
    """Text, tracebacks and PNG/JPEG images only: no HTML, JavaScript, SVG, widgets or metadata."""
    kept = []
    for out in outputs if isinstance(outputs, list) else []:
        kind = out.get("output_type") if isinstance(out, dict) else None
        if kind == "stream":
            name = "stderr" if out.get("name") == "stderr" else "stdout"
            kept.append({"output_type": "stream", "name": name,
                         "text": shown(source_text({"source": out.get("text", "")}))})
        elif kind == "error":
            trace = out.get("traceback", [])
            kept.append({"output_type": "error", "ename": str(out.get("ename", ""))[:200],
                         "evalue": shown(str(out.get("evalue", ""))[:2000]),
                         "traceback": [shown(str(line)[:2000]) for line in trace[-40:]]
                                      if isinstance(trace, list) else []})
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {}) if isinstance(out.get("data"), dict) else {}
            # A Markdown output (the exercises' result tables) is kept as its text: readable, never
            # rendered (its HTML would be the student's); its text/plain is only the object's repr.
            plain = data.get("text/markdown", data.get("text/plain"))
            clean = {"text/plain": LONG_ESCAPE.sub("", source_text({"source": plain}))} if plain is not None else {}
            for mime in ("image/png", "image/jpeg"):
                if isinstance(data.get(mime), str) and IMAGE.match(data[mime]):
                    clean[mime] = data[mime]
            kept.append({"output_type": "display_data", "data": clean, "metadata": {}})
    return kept


def capped(outputs: list[dict], budget: list[int]) -> list[dict]:
    """`outputs` within what is left of the feedback's OUTPUT_CHARS (`budget`, shared by all cells)."""
    kept = []
    for out in outputs:
        size = len(json.dumps(out))
        if size > budget[0]:
            kept.append({"output_type": "stream", "name": "stdout",
                         "text": "[grader] output dropped: the feedback holds at most "
                                 f"{OUTPUT_CHARS:,} characters of output in all\n"})
            budget[0] = 0
            break
        budget[0] -= size
        kept.append(out)
    return kept


def cut(text: str, budget: list[int]) -> str:
    """`text`, or its first SOURCE_CHARS characters (fewer once `budget`, the characters left for
    the whole page, runs out) and a line saying how many more were not shown."""
    keep = max(0, min(len(text), SOURCE_CHARS, budget[0]))
    budget[0] -= keep
    return text if keep == len(text) else (
        f"{text[:keep]}\n\n(... {len(text) - keep:,} more characters, not shown in the feedback)")


def files_cell(graded: str, others: list[str], handed_out: set[str] = frozenset(), uploaded: str | None = None) -> dict:
    """The page's first cell: which file of the submission was graded (by the name the student
    `uploaded` it under to the LMS, if another), and which were not (and which of those are as
    handed out: no answer changed)."""
    text = f"This page grades the notebook {uploaded or graded!r} of your submission."
    if others:
        listed = ", ".join(repr(name) + (" (as handed out: no answer changed)" if name in handed_out else "")
                           for name in others[:5])
        text += f" Not graded: {listed}{' ...' if len(others) > 5 else ''} (one notebook per submission is graded)."
    return {"cell_type": "markdown", "metadata": {}, "source": inert_markdown(text[:2000])}


def stopped_cell(stopped: str) -> dict:
    """Where the student's notebook, as handed in, stopped before test cells (notebooks.stopped_at)."""
    text = (f"Your notebook as handed in stopped at {stopped}: *Run All* stops at a cell that raises, so "
            "the test cells after it did not run in your notebook (a tick they show there is from an earlier "
            "run). Grading runs each part on its own: those parts are graded below. Fix or remove that cell, "
            "so that your notebook runs to the end.")
    return {"cell_type": "markdown", "metadata": {}, "source": inert_markdown(text)}


def feedback_notebook(ran: dict, release: dict, points: dict, verdicts: dict,
                      files: tuple | None = None, stopped: str | None = None) -> dict:
    """The notebook generate_feedback renders: inert, test cells as released plus the verdict of
    the hidden tests and what the visible tests printed or raised (`verdicts` hold safe messages);
    `files`: (the graded file's name, the submission's other notebooks[, those of them as handed
    out]), said first; `stopped`: where the notebook as handed in stopped before test cells."""
    released = {grade_id(c): c for c in release["cells"] if grade_id(c)}
    cells, budget, sources = ([files_cell(*files)] if files else []), [OUTPUT_CHARS], [SOURCE_TOTAL]
    cells += [stopped_cell(stopped)] if stopped else []
    ran = normalised(ran, release)
    untouched = untouched_parts(ran, release)
    for cell in ran["cells"]:
        kind, gid = cell.get("cell_type"), grade_id(cell)
        metadata = {"nbgrader": cell["metadata"]["nbgrader"]} if gid else {}
        if kind == "markdown":
            cells.append({"cell_type": "markdown", "metadata": metadata, "source": inert_markdown(cut(source_text(cell), sources))})
        elif kind == "code" and gid in points:
            verdict = verdicts.get(gid, {"passed": False, "message": "not graded"})
            shown = [o for o in safe_outputs(cell.get("outputs")) if o["output_type"] in ("stream", "error")]
            visible = (None if not shown else not any(o["output_type"] == "error" for o in shown))
            attempted = verdict["passed"] or part_of(gid) not in untouched
            note = ("\N{CHECK MARK} " if verdict["passed"] else "\N{BALLOT X} ") + (feedback_page.verdict(
                visible, verdict["passed"], verdict["message"], points[gid]) if attempted else
                feedback_page.not_attempted(points[gid]))
            cells.append({"cell_type": "code", "metadata": metadata, "execution_count": execution_count(cell),
                          "source": source_text(released[gid]),
                          "outputs": capped(shown, budget) + [{"output_type": "stream", "name": "stdout",
                                                               "text": f"{note}\n"}]})
        elif kind == "code":
            cells.append({"cell_type": "code", "metadata": metadata, "execution_count": execution_count(cell),
                          "source": cut(source_text(cell), sources),
                          "outputs": capped(safe_outputs(cell.get("outputs")), budget) + (
                              [{"output_type": "stream", "name": "stdout", "text": SUMMARY_NOTE}]
                              if gid == "summary" else [])})
    # Each cell an id of its own, as format 4.5 asks (without, nbformat warns at every read that it
    # "will become a hard error", and every page would then fail: red team 26, A14).
    return {"cells": [{"id": f"cell-{number}", **cell} for number, cell in enumerate(cells)],
            "metadata": {**{k: v for k, v in release.get("metadata", {}).items() if k == "kernelspec"},
                         "language_info": LANGUAGE_INFO},
            "nbformat": 4, "nbformat_minor": 5}


# The code cells are highlighted with pygments' Python lexer, not the notebook's `ipython3`: that one
# takes time quadratic in an attribute chain `x.y.y.y...` (red team 28, A03: 10,000 of them, 18 s of
# the grader's process; Python's lexer, 0.1 s). The page loses only IPython's `%magic` colours.
LANGUAGE_INFO = {"name": "python", "pygments_lexer": "python"}


def feedback_for(course: Path, assignment: str, students: list[str], url: str | None = None) -> dict[str, str]:
    """nbgrader's feedback pages for `students` only (a shard writes its own students' pages).
    Returns {student: why their page failed}: one page nbgrader cannot render costs that student
    their page, never the others theirs (each is then rendered on its own)."""
    def render(some: list[str]) -> str | None:
        others = sorted({p.parent.name for p in (course / "autograded").glob(f"*/{assignment}")} - set(some))
        return render_pages(course, assignment, others, url)

    if not students or render(students) is None:
        finish_pages(course, assignment, students)
        return {}
    failures = {}
    for student in students:
        said = render([student])
        if said is not None:
            lines = said.strip().splitlines() or ["no message"]
            why = next((line for line in reversed(lines) if "Error" in line), lines[-1])
            failures[student] = f"nbgrader generate_feedback failed: {why.strip()}"[:300]
    finish_pages(course, assignment, [s for s in students if s not in failures])
    return failures


# nbgrader's feedback page shows code and outputs in <pre> boxes that cut a long line at the page's
# edge (a student cannot scroll a printout): wrapped, as the verdict is (feedback_page.verdict).
WRAP_STYLE = ("<style>/* grader: long lines wrapped */ div.input_area pre, div.output_area pre "
              "{ white-space: pre-wrap; overflow-wrap: anywhere; }</style>")
# nbgrader's template lists the scores as "Test cell (Score: 2.0 / 2.0)", four alike, and heads each
# test cell "Grade cell: p1_tests", nbgrader's words (walkthrough 3, issue 48): the part's name
# instead. Only the template's own markup matches: a student's text in the page is escaped.
# nbgrader's template also loads MathJax from a CDN: a request to a third party each time a student
# opens the page online (instructor walkthrough 47b, C5), for maths already turned into text here.
MATHJAX = re.compile(r'<script src="https://cdnjs\.cloudflare\.com/ajax/libs/mathjax/[^"]*">\s*</script>'
                     r'|<script type="text/x-mathjax-config">.*?</script>', re.S)
SCORE_LINK = re.compile(r'<a href="#(p(\d+)_tests)">Test cell</a>')
TEST_HEADING = re.compile(r'Grade cell: <code>p(\d+)_tests</code>')


def render_pages(course: Path, assignment: str, excluded: list[str], url: str | None = None) -> str | None:
    """`nbgrader generate_feedback <assignment> --force` for the autograded students not `excluded`,
    in this process (grader/course.py, in_process; a command of its own cost 1 s of CPU to start, at
    every grading, issue 52): None, or what nbgrader said when it failed. The students left out go
    to nbgrader as a setting, never on a command line (red team 45i, A06: 6,000 ids made one argument
    longer than Linux's 128 KiB, and nbgrader never started)."""
    from grader.gradebook import db_url
    with plain_fences():
        result = in_process(course, lambda api: api.generate_feedback(assignment, force=True),
                            student_id_exclude=",".join(excluded), db_url=db_url(course, url))
    return None if result["success"] else f"{result.get('log', '')}\n{result.get('error', '')}"


@contextlib.contextmanager
def plain_fences():
    """While the pages render, a fenced block in a student's Markdown is shown as plain text, its
    info string ignored: nbconvert highlights it with whichever of pygments' 600 lexers the info
    string names, and some take time cubic in a cell (red team 28, A06: 2,000 tabs in an
    ```` ```easytrieve ```` fence, 20 s of the grader's process; 20,000, hours), or draw a diagram
    with a script (```` ```mermaid ````)."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer
    original = IPythonRenderer.block_code
    IPythonRenderer.block_code = lambda self, code, info=None: original(self, code, None)
    try:
        yield
    finally:
        IPythonRenderer.block_code = original


def finish_pages(course: Path, assignment: str, students: list[str]) -> None:
    """Long lines wrapped, the test cells named by their part and no MathJax from a CDN, in each
    student's page."""
    for student in students:
        page = course / "feedback" / student / assignment / f"{assignment}.html"
        if page.is_file() and not any(p.is_symlink() for p in (page, page.parent, page.parent.parent)):
            html = page.read_text(encoding="utf-8")
            if WRAP_STYLE not in html and "</head>" in html:
                html = html.replace("</head>", WRAP_STYLE + "\n</head>", 1)
            html = SCORE_LINK.sub(lambda m: f'<a href="#{m[1]}">Part {m[2]}</a>', html)
            html = TEST_HEADING.sub(lambda m: f"Tests of Part {m[1]}", html)
            html = MATHJAX.sub("", html)
            page.write_text(html, encoding="utf-8")


def chosen(students, only: list[str] | None, assignment: str):
    """`students` (ids, or a dict keyed by id), cut to `only` where given; ValueError naming an id of
    `only` that is not among them."""
    if only is None:
        return students
    unknown = sorted(set(only) - set(students))
    if unknown:
        raise ValueError(f"no submission of {assignment} for {', '.join(unknown)}")
    return {s: students[s] for s in students if s in only} if isinstance(students, dict) else \
        [s for s in students if s in only]


# A student without a page of their current grade: `grade --no-feedback` removes the page of the
# grade before (grader/gradebook.py, `record`; red team 16c, A08: the old page was packed as current).
NO_PAGE = ("  NO FEEDBACK for {student}: no page of their current grade (not graded yet, or graded with "
           "--no-feedback, which removes the earlier page): python -m grader grade {assignment} --regrade --student {student}")


def some_zip(only: list[str] | None) -> str:
    """The end of the name of a zip of `only` some students' pages: `-some`, so that it does not
    replace the class's zip (instructor walkthrough 47e, 4)."""
    return "" if only is None else "-some"


def pack_feedback(course: Path, assignment: str, out: Path, url: str | None = None,
                  only: list[str] | None = None) -> list[Path]:
    """Each student's feedback page, for upload to an LMS without nbgrader's exchange: copied to
    OUT/<assignment>/<student>_<assignment>.html, and all of them in OUT/<assignment>-feedback.zip.
    With `only`, those students' pages alone, zipped in OUT/<assignment>-feedback-some.zip. Returns
    the pages; names the students who handed in but have no feedback page, and removes their page
    that an earlier pack left in OUT/<assignment>/ (red team 16d, F: a page of an earlier grade
    stayed beside a "0 feedback pages" line). Refuses (ValueError) while a page is of a submission
    handed in again since (red team 45l, A02: the old page packed)."""
    from grader.gradebook import refuse_not_current
    pages, missing, removed = [], [], []
    students = chosen(sorted({p.parent.name for p in (course / "submitted").glob(f"*/{assignment}")} |
                             {p.parent.name for p in (course / "feedback").glob(f"*/{assignment}")}), only, assignment)
    refuse_not_current(course, assignment, url, "packed", students)
    # A page that a stopped grading left as nbgrader wrote it (MathJax from a CDN, nbgrader's cell
    # names) is finished here, as the grading would have (red team 28, A08: such pages were packed).
    finish_pages(course, assignment, students)
    folder = out / assignment
    folder.mkdir(parents=True, exist_ok=True)
    for student in students:
        page = course / "feedback" / student / assignment / f"{assignment}.html"
        target = folder / f"{student}_{assignment}.html"
        if not page.is_file() or any(p.is_symlink() for p in (page, page.parent, page.parent.parent)):
            missing.append(student)
            if target.is_symlink() or target.is_file():  # only a page this command writes
                target.unlink()
                removed.append(target)
            continue
        shutil.copyfile(page, target)
        pages.append(target)
    zipped = out / f"{assignment}-feedback{some_zip(only)}.zip"
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as archive:
        for page in pages:
            archive.write(page, page.name)
    print(one_line(f"{plural(len(pages), 'feedback page')} in {folder}/ and {zipped}"))
    for student in missing:
        print(one_line(NO_PAGE.format(student=student, assignment=assignment)))
    for target in removed:
        print(one_line(f"  removed {target}: a page of an earlier grade"))
    return pages

"""The instructor's path from a fresh private clone to returnable feedback (issue 36): each step
the guide gives works as written, on one tiny course with few students."""
import contextlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
from grader import collect, fabricate, feedback, gradebook, notebooks, runs, schedule  # noqa: E402
from tests import browser, postgres  # noqa: E402

CHROMIUM = browser.find_chromium()

ASSIGNMENT = "ex2_loss_scaling"
NO_SANDBOX = runs.sandbox_problem()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")


def in_the_browser(page: Path, width: int = 1000) -> dict:
    """What headless Chromium shows of a feedback page, offline: its text, for each verdict box
    whether it scrolls sideways, and for each code cell's box whether it cuts a line."""
    with browser.Chromium(CHROMIUM) as chromium:
        chromium.set_viewport(width, 800, mobile=False)
        assert chromium.open(page.as_uri()) is None
        return chromium.evaluate("""({text: document.body.innerText,
            verdicts: [...document.querySelectorAll('pre')].filter(p => p.innerText.includes('Graded:'))
                      .map(p => p.scrollWidth > p.clientWidth + 1),
            code: [...document.querySelectorAll('div.input_area pre')].map(p => p.scrollWidth > p.clientWidth + 1)})""")


def fresh_course(course: Path) -> Path:
    """A course directory as a clone holds it: config, source and release, no gradebook."""
    course.mkdir(parents=True)
    (course / "nbgrader_config.py").write_text((ROOT / "nbgrader_config.py").read_text())
    for folder in ("solutions", "exercises"):
        (course / folder / ASSIGNMENT).mkdir(parents=True)
        name = f"{ASSIGNMENT}.ipynb"
        (course / folder / ASSIGNMENT / name).write_text((ROOT / folder / ASSIGNMENT / name).read_text())
    return course


STUDENT_DATA = ["downloaded/ex2/archive/canvas.zip", "submitted/jane/ex2/ex2.ipynb", "autograded/jane/ex2/ex2.ipynb",
                "feedback/jane/ex2/ex2.html", "feedback-upload/jane_ex2.html", "gradebook.db", "grades.csv",
                "grades-ex2-canvas.csv", "grades-ex2-moodle.csv", "_build/release-gradebook.db", ".grading-secret"]


@pytest.mark.parametrize("path", STUDENT_DATA)
def test_student_data_and_the_secret_are_ignored_by_git(path):
    result = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT)
    assert result.returncode == 0, f"{path} would be committed"


def test_the_secret_comes_from_the_variable_then_the_untracked_file(tmp_path, monkeypatch):
    course = fresh_course(tmp_path / "course")
    monkeypatch.delenv(gradebook.SECRET_VARIABLE, raising=False)
    with pytest.warns(UserWarning, match="placeholder"):
        assert gradebook.instructor_secret(course) == gradebook.PLACEHOLDER_SECRET
    (course / ".grading-secret").write_text("from-the-file-" + "f" * 32 + "\n")
    (course / ".grading-secret").chmod(0o600)
    assert gradebook.instructor_secret(course) == "from-the-file-" + "f" * 32
    monkeypatch.setenv(gradebook.SECRET_VARIABLE, "from-the-variable-" + "v" * 32)
    assert gradebook.instructor_secret(course) == "from-the-variable-" + "v" * 32


def test_the_command_line_says_a_missing_secret_in_one_line_not_as_a_python_warning(tmp_path, monkeypatch):
    """Issue 48, third walkthrough: the first `grade` printed Python's `file:line: UserWarning:`
    and the `warnings.warn(...)` source line, which read as a crash."""
    import warnings

    from grader.__main__ import main
    course = fresh_course(tmp_path / "course")
    monkeypatch.delenv(gradebook.SECRET_VARIABLE, raising=False)
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # main() sets it; put back after
    with pytest.raises(SystemExit):
        main(["grade"])  # no assignment named: the command line stops after its set-up
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gradebook.instructor_secret(course)
    shown = warnings.formatwarning(caught[0].message, caught[0].category, caught[0].filename, caught[0].lineno)
    assert shown.startswith("WARNING: no grading secret") and shown.count("\n") == 1 and "warnings.warn" not in shown


def test_a_secret_in_a_tracked_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(gradebook.SECRET_VARIABLE, raising=False)
    course = fresh_course(tmp_path / "course")
    private_secret(course, "pushed-one-day")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=course, check=True)
    subprocess.run([*git, "add", "-f", ".grading-secret"], cwd=course, check=True)
    with pytest.raises(gradebook.SecretError, match="tracked by git"):
        gradebook.instructor_secret(course)
    (course / ".grading-secret").unlink()
    config = course / "nbgrader_config.py"
    config.write_text(config.read_text().replace('secret = "public-placeholder"', 'secret = "mine"'))
    with pytest.raises(gradebook.SecretError, match="nbgrader_config.py"):
        gradebook.instructor_secret(course)


@pytest.mark.skipif(os.geteuid() != 0, reason="git's ownership check refuses only root here")
def test_a_secret_in_a_clone_git_will_not_read_is_refused_not_read_as_untracked(tmp_path, monkeypatch):
    """Fresh review 37g: root in another user's clone (after `su -`, no SUDO_UID) gets git's
    "dubious ownership" refusal; it was read as "not tracked", and the committed secret was used."""
    monkeypatch.delenv(gradebook.SECRET_VARIABLE, raising=False)
    monkeypatch.delenv("SUDO_UID", raising=False)
    course = fresh_course(tmp_path / "course")
    private_secret(course, "pushed-one-day")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=course, check=True)
    subprocess.run([*git, "add", "-f", ".grading-secret"], cwd=course, check=True)
    subprocess.run(["chown", "-R", "65534:65534", str(course)], check=True)  # another user's clone
    monkeypatch.setenv("HOME", str(tmp_path))  # no safe.directory of this machine's root applies
    refused = subprocess.run(["git", "ls-files"], cwd=course, capture_output=True, text=True)
    assert refused.returncode == 128 and "dubious ownership" in refused.stderr, refused.stderr
    with pytest.raises(gradebook.SecretError, match="git cannot tell"):
        gradebook.instructor_secret(course)
    outside = fresh_course(tmp_path / "not-a-clone")  # no repository at all: no question to ask git
    secret = private_secret(outside, "mine")
    assert gradebook.instructor_secret(outside) == secret


def private_secret(course, start: str) -> str:
    """A secret of SECRET_CHARS characters beginning `start`, in the course's .grading-secret, mode 600."""
    secret = (start + "-" + "s" * gradebook.SECRET_CHARS)[:max(gradebook.SECRET_CHARS, len(start))]
    (course / ".grading-secret").write_text(secret + "\n")
    (course / ".grading-secret").chmod(0o600)
    return secret


def test_a_secret_git_holds_anywhere_a_link_a_readable_file_or_a_short_one_is_refused(tmp_path, monkeypatch):
    """Red team 14: a secret committed and then `git rm --cached` (as the refusal said to do) or
    committed on another branch was used, though a push sends it (s03, s04); so was a
    .grading-secret linking to a tracked or public file (s05, s06, s28), one others can read (s08),
    a 10-character one (s29: guessed from one student's derived secret in 1,305 tries), a GIT_DIR
    pointing git at another repository (s09), one git does not ignore (s16: one `git add -A` from
    committed); a folder or no git installed was a traceback."""
    monkeypatch.delenv(gradebook.SECRET_VARIABLE, raising=False)
    course = fresh_course(tmp_path / "course")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=course, check=True)
    secret = private_secret(course, "committed")
    subprocess.run([*git, "add", "-f", ".grading-secret"], cwd=course, check=True)
    subprocess.run([*git, "commit", "-qm", "oops"], cwd=course, check=True)
    subprocess.run([*git, "rm", "-q", "--cached", ".grading-secret"], cwd=course, check=True)
    with pytest.raises(gradebook.SecretError, match="does not ignore it"):  # s16: one `git add -A` away
        gradebook.instructor_secret(course)
    (course / ".gitignore").write_text("/.grading-secret\n")
    with pytest.raises(gradebook.SecretError, match="in git's history"):
        gradebook.instructor_secret(course)
    other = tmp_path / "elsewhere"
    subprocess.run([*git, "init", "-q", str(other)], check=True)
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))  # git asked about another repository: still refused
    with pytest.raises(gradebook.SecretError, match="in git's history"):
        gradebook.instructor_secret(course)
    monkeypatch.delenv("GIT_DIR")
    new = private_secret(course, "a-new-one")
    assert gradebook.instructor_secret(course) == new != secret  # a new secret, never committed: read
    (course / ".grading-secret").chmod(0o644)
    with pytest.raises(gradebook.SecretError, match="chmod 600"):
        gradebook.instructor_secret(course)
    (course / ".grading-secret").unlink()
    (course / ".grading-secret").symlink_to(course / "README.md" if (course / "README.md").exists() else course / "nbgrader_config.py")
    with pytest.raises(gradebook.SecretError, match="is a link"):
        gradebook.instructor_secret(course)
    (course / ".grading-secret").unlink()
    private_secret(course, "linked")
    os.link(course / ".grading-secret", tmp_path / "copy")
    with pytest.raises(gradebook.SecretError, match="hard link"):
        gradebook.instructor_secret(course)
    (course / ".grading-secret").unlink()
    (course / ".grading-secret").mkdir()
    with pytest.raises(gradebook.SecretError, match="not a file"):
        gradebook.instructor_secret(course)
    (course / ".grading-secret").rmdir()
    private_secret(course, "no-git-here")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # git not installed, in a repository: cannot tell
    with pytest.raises(gradebook.SecretError, match="git is not installed"):
        gradebook.instructor_secret(course)
    monkeypatch.undo()
    monkeypatch.setenv(gradebook.SECRET_VARIABLE, "spring2026")
    with pytest.raises(gradebook.SecretError, match="10 characters"):
        gradebook.instructor_secret(course)
    monkeypatch.setenv(gradebook.SECRET_VARIABLE, gradebook.PLACEHOLDER_SECRET)
    with pytest.warns(UserWarning, match="placeholder"):
        assert gradebook.instructor_secret(course) == gradebook.PLACEHOLDER_SECRET


@needs_sandbox
def test_a_python_that_cannot_import_the_course_inside_the_sandbox_is_refused_before_grading(tmp_path, monkeypatch):
    assert runs.environment_problem(sandbox=True) is None
    monkeypatch.setattr(runs, "ROOT", tmp_path)  # a repository without mpcourse/: the library is not shown
    problem = runs.environment_problem(sandbox=True)
    if problem is None:
        pytest.skip("mpcourse is installed inside the environment itself here")
    assert "No module named 'mpcourse'" in problem and sys.executable in problem
    with pytest.raises(runs.BrokenEnvironment, match="refusing to grade.*mpcourse"):
        schedule.grade(tmp_path, ASSIGNMENT, timeout=20)


def test_a_machine_without_bubblewrap_is_refused_in_one_sentence(tmp_path):
    course = fresh_course(tmp_path / "course")
    result = subprocess.run([sys.executable, "-m", "grader", "grade", ASSIGNMENT, "--course", str(course)],
                            cwd=ROOT, env={**os.environ, "PATH": str(tmp_path)}, capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "bubblewrap" in result.stderr and "--no-sandbox" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_pack_feedback_names_each_students_page_for_upload(tmp_path):
    import zipfile
    course = fresh_course(tmp_path / "course")
    for student in ("jane", "omar"):
        page = course / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html"
        page.parent.mkdir(parents=True)
        page.write_text(f"<html>feedback for {student}</html>")
    # Jane's as nbgrader wrote it, never finished: the grading was stopped (red team 28, A08)
    raw = ('<html><head><script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js?config=TeX">'
           '</script></head><body>Grade cell: <code>p1_tests</code></body></html>')
    (course / "feedback" / "jane" / ASSIGNMENT / f"{ASSIGNMENT}.html").write_text(raw)
    fabricate.write_submission(course, ASSIGNMENT, "late_lee", {})  # handed in, not graded yet
    result = subprocess.run([sys.executable, "-m", "grader", "pack-feedback", ASSIGNMENT,
                             "--course", str(course), "--out", str(tmp_path / "upload")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    pages = tmp_path / "upload" / ASSIGNMENT
    assert sorted(p.name for p in pages.iterdir()) == [f"jane_{ASSIGNMENT}.html", f"omar_{ASSIGNMENT}.html"]
    assert (pages / f"omar_{ASSIGNMENT}.html").read_text() == "<html>feedback for omar</html>"
    jane = (pages / f"jane_{ASSIGNMENT}.html").read_text()
    assert "mathjax" not in jane and "Tests of Part 1" in jane and feedback.WRAP_STYLE in jane, jane
    with zipfile.ZipFile(tmp_path / "upload" / f"{ASSIGNMENT}-feedback.zip") as archive:
        assert sorted(archive.namelist()) == [f"jane_{ASSIGNMENT}.html", f"omar_{ASSIGNMENT}.html"]
    assert "NO FEEDBACK for late_lee" in result.stdout
    # A re-submission's new page alone (instructor walkthrough 47d, A: --student was taken and ignored),
    # in a zip of its own: it replaced the class's zip (instructor walkthrough 47e, 4)
    from grader.__main__ import main
    main(["pack-feedback", ASSIGNMENT, "--course", str(course), "--out", str(tmp_path / "upload"), "--student", "omar"])
    with zipfile.ZipFile(tmp_path / "upload" / f"{ASSIGNMENT}-feedback-some.zip") as archive:
        assert archive.namelist() == [f"omar_{ASSIGNMENT}.html"]
    with zipfile.ZipFile(tmp_path / "upload" / f"{ASSIGNMENT}-feedback.zip") as archive:
        assert sorted(archive.namelist()) == [f"jane_{ASSIGNMENT}.html", f"omar_{ASSIGNMENT}.html"]
    with pytest.raises(SystemExit, match=f"no submission of {ASSIGNMENT} for omr"):
        main(["pack-feedback", ASSIGNMENT, "--course", str(course), "--student", "omr"])
    # Red team 16d, F: Jane's page removed (as `grade --no-feedback` does): the next pack named her
    # NO FEEDBACK and left her earlier page in the folder of pages to hand back
    (course / "feedback" / "jane" / ASSIGNMENT / f"{ASSIGNMENT}.html").unlink()
    (pages / "notes.txt").write_text("the instructor's")
    result = subprocess.run([sys.executable, "-m", "grader", "pack-feedback", ASSIGNMENT,
                             "--course", str(course), "--out", str(tmp_path / "upload")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "NO FEEDBACK for jane" in result.stdout and f"removed {pages / f'jane_{ASSIGNMENT}.html'}" in result.stdout
    assert sorted(p.name for p in pages.iterdir()) == ["notes.txt", f"omar_{ASSIGNMENT}.html"]


def test_feedback_markdown_shows_inline_code_as_written_and_maths_as_text():
    from nbconvert.filters.markdown_mistune import markdown2html_mistune
    text = ("Pick `0 < backoff_factor < 1` and `a && b`; values below $2^{-25}$ round to zero, "
            "$2^{-25} \\approx 2.98 \\times 10^{-8}$. <script>alert(1)</script> &#106;")
    page = markdown2html_mistune(feedback.inert_markdown(text))
    assert "<code>0 &lt; backoff_factor &lt; 1</code>" in page and "<code>a &amp;&amp; b</code>" in page
    assert "&amp;lt;" not in page and "&amp;amp;" not in page  # escaped once, not twice
    assert "2⁻²⁵ ≈ 2.98 × 10⁻⁸" in page and "$" not in page
    assert "<script" not in page and "&amp;#106;" in page  # still no HTML, no entity decoded
    tricks = ("`<script>x</script>` $\\text{<img src=x onerror=alert(1)>}$ $\\text{](javascript:alert(1))}$ "
              "<b>`x`</b> &#60;script&#62; \\<script>alert(1)</script> <!-- x --> </p>")
    page = markdown2html_mistune(feedback.inert_markdown(tricks))
    assert not any(tag in page for tag in ("<script", "<img", "<b>", "<!--", "href")) and page.count("</p>") == 1


def test_the_students_own_text_in_the_feedback_page_is_cut_to_a_bound():
    """nbgrader renders the feedback page outside every sandbox: a 10 MB Markdown cell took it past
    3.9 GB (red team 45d, A04). Each cell's source is cut, and all of them together."""
    big_markdown = {"cell_type": "markdown", "metadata": {}, "source": "*_" * 5_000_000}
    big_code = {"cell_type": "code", "metadata": {}, "source": "x = 1\n" * 100_000, "outputs": []}
    small = {"cell_type": "markdown", "metadata": {}, "source": "A short note."}
    release = {"cells": [], "metadata": {}}
    ran = {"cells": [big_markdown, big_code, small] + [dict(big_code) for _ in range(20)] + [dict(small)]}
    nb = feedback.feedback_notebook(ran, release, {}, {})
    assert len({cell["id"] for cell in nb["cells"]}) == len(nb["cells"]) and nb["nbformat_minor"] == 5  # red team 26, A14
    # counted as shown: a run of `*` or `_` is escaped, one backslash before each (red team 26, A08)
    sources = ["".join(cell["source"]).replace("\\*", "*").replace("\\_", "_") for cell in nb["cells"]]
    assert all(len(text) < feedback.SOURCE_CHARS + 200 for text in sources)
    assert sum(map(len, sources)) < feedback.SOURCE_TOTAL + 200 * len(sources)
    assert "more characters, not shown in the feedback" in sources[0] and "A short note." in sources[2]
    assert "not shown" in sources[-1]  # past the page's budget even a short cell is cut


def test_a_completed_notebook_is_far_inside_the_feedback_pages_source_limits():
    """A student's completed notebook is about a solution's size: at most half of each limit, so that
    an honest notebook with notes and helper cells added is shown whole (review 69: the limits'
    comment named a size no notebook had)."""
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        sources = ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]]
        assert max(map(len, sources)) <= feedback.SOURCE_CHARS / 2, path.name
        assert sum(map(len, sources)) <= feedback.SOURCE_TOTAL / 2, path.name


def test_the_verdict_says_plainly_which_tests_passed_and_is_not_one_long_line():
    release = {"cells": [{"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "p1_tests", "grade": True,
                                                                          "points": 2}}, "source": "check()"}],
               "metadata": {}}
    ran = {"cells": [{**release["cells"][0], "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "\N{CHECK MARK} Part 1: all tests in this cell pass.\n"}]}]}
    message = "min_loss_scale of values spanning 40 binades should raise a ValueError; it returned 2.0 " * 2
    nb = feedback.feedback_notebook(ran, release, {"p1_tests": 2.0}, {"p1_tests": {"passed": False, "message": message}})
    note = nb["cells"][0]["outputs"][-1]["text"]
    assert "visible tests above passed, but the hidden tests failed (the same checks on other inputs, and on bad inputs)" \
        in " ".join(note.split()) and "Graded: 0 / 2" in note
    assert "should raise a ValueError" in " ".join(note.split())
    assert max(map(len, note.splitlines())) <= 90


def test_the_report_notes_a_notebook_whose_visible_tests_failed_in_the_run_but_graded_full():
    """Issue 48, third walkthrough: a hand-in whose Run All stops at a try-out line, so that two
    visible test cells fail in the notebook, got 10/10 (grading runs the lines after a raising one)
    and the report said nothing: the instructor should know the notebook does not run to the end."""
    def test_cell(gid, outputs):
        return {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": gid, "grade": True}}, "outputs": outputs}
    error = {"output_type": "error", "ename": "NameError", "evalue": "name '_differ' is not defined", "traceback": []}
    tick = {"output_type": "stream", "name": "stdout", "text": "ok"}
    ran = {"cells": [test_cell("p1_tests", [tick]), test_cell("p3_tests", [error]), test_cell("p4_tests", [error]),
                     {"cell_type": "code", "metadata": {}, "outputs": [error]}]}
    verdicts = {"p1_tests": {"passed": True}, "p3_tests": {"passed": True}, "p4_tests": {"passed": False}}
    points = {"p1_tests": 2.0, "p3_tests": 3.0, "p4_tests": 2.0}
    assert gradebook.visible_failures(ran, verdicts, points) == ["p3_tests"]  # p4 failed: its message says so
    assert gradebook.visible_failures({"cells": "not a list"}, verdicts, points) == []


def test_a_markdown_output_is_kept_as_its_text_never_rendered():
    """Issue 48, third walkthrough: the exercises' result tables (`display(Markdown(...))`) showed
    as "<IPython.core.display.Markdown object>" in the feedback."""
    table = "| piece | breaks |\n|---|---|\n| RNG | the batches |\n<script>alert(1)</script>"
    out = {"output_type": "display_data", "metadata": {},
           "data": {"text/markdown": table, "text/plain": "<IPython.core.display.Markdown object>"}}
    assert feedback.safe_outputs([out]) == [{"output_type": "display_data", "data": {"text/plain": table},
                                             "metadata": {}}]


def test_an_escape_sequence_longer_than_a_colour_never_reaches_the_page_renderer():
    """Red team 24, A02b: one terminal escape of 980,000 characters (within the output cap) held the
    grader's process 24 s in nbconvert's ansi2html; a colour's own escapes stay, and the text after."""
    from nbconvert.filters.ansi import ansi2html
    red, attack = "\x1b[38;5;196mred\x1b[0m", "\x1b[" + "38;5;1;" * 20_000 + "1m"
    spaced = "\x1b[" + " 0;" * 20_000 + "m"  # red team 25: blanks between the numbers, as nbconvert reads them too
    outs = feedback.safe_outputs([{"output_type": "stream", "name": "stdout", "text": f"{red} {attack}after"},
                                  {"output_type": "error", "ename": "E", "evalue": attack, "traceback": [red + attack]},
                                  {"output_type": "display_data", "data": {"text/plain": f"{spaced}x"}}])
    assert outs[0]["text"] == f"{red} after" and outs[1]["evalue"] == "" and outs[1]["traceback"] == [red]
    assert outs[2]["data"]["text/plain"] == "x"
    assert "red" in ansi2html(outs[0]["text"]) and "after" in ansi2html(outs[0]["text"])


def test_a_part_graded_full_under_visible_tests_that_failed_in_the_run_says_why():
    """Issue 48, third walkthrough: a try-out line that raised above a helper stopped that cell, so
    the visible tests failed with a NameError in the run, and grading (which runs the lines after a
    raising one) gave full points; the page said the hidden tests "passed too"."""
    release = {"cells": [{"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "p3_tests", "grade": True,
                                                                          "points": 3}}, "source": "check()"}],
               "metadata": {}}
    failed = {"output_type": "error", "ename": "NameError", "evalue": "name '_differ' is not defined", "traceback": []}
    passed = {"output_type": "stream", "name": "stdout", "text": "\N{CHECK MARK} Part 3: all tests in this cell pass.\n"}
    notes = {}
    for name, outputs in (("failed", [failed]), ("passed", [passed]), ("not run", [])):
        ran = {"cells": [{**release["cells"][0], "outputs": outputs}]}
        nb = feedback.feedback_notebook(ran, release, {"p3_tests": 3.0}, {"p3_tests": {"passed": True, "message": ""}})
        notes[name] = " ".join(nb["cells"][0]["outputs"][-1]["text"].split())
    assert "Graded: 3 / 3" in notes["failed"] and "failed in this run of your notebook" in notes["failed"]
    assert "too" not in notes["failed"] and "run to the end" in notes["failed"]
    assert notes["passed"].endswith("passed too.") and notes["not run"].endswith("bad inputs) passed.")


def test_a_feedback_page_loads_nothing_and_names_its_parts(tmp_path):
    """Instructor walkthrough 47b, C5: nbgrader's page loaded MathJax from a CDN each time a student
    opened it online (the maths is text already); walkthrough 3: its test cells were "Test cell" and
    "Grade cell: p1_tests". A student's own text that reads the same is escaped, and kept."""
    page = tmp_path / "feedback" / "ada" / "ex" / "ex.html"
    page.parent.mkdir(parents=True)
    mine = "&lt;script src=&quot;https://cdnjs.cloudflare.com/ajax/libs/mathjax/x.js&quot;&gt;"
    page.write_text('<html><head><script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js?config=TeX">'
                    ' </script>\n<script type="text/x-mathjax-config">\ninit_mathjax = 1;\n</script></head><body>'
                    '<li><a href="#p1_tests">Test cell</a> (Score: 2.0 / 2.0)</li>'
                    '<span class="nbgrader-label">Grade cell: <code>p1_tests</code></span>' + mine + "</body></html>")
    feedback.finish_pages(tmp_path, "ex", ["ada"])
    html = page.read_text()
    assert "<script" not in html and "x-mathjax-config" not in html and mine in html
    assert '<a href="#p1_tests">Part 1</a> (Score: 2.0 / 2.0)' in html and "Tests of Part 1" in html
    assert feedback.WRAP_STYLE in html


def test_the_feedback_reads_like_the_notebook_run_and_names_a_part_not_attempted():
    """Issue 47: the run's execution counts (none only where a cell did not run), no path of the
    grading machine in a traceback or warning, and "not attempted" for a part whose answer cells
    are as handed out (not "failed: NotImplementedError")."""
    import sys
    answer = {"nbgrader": {"grade_id": "p1_solution", "solution": True}}
    test = {"nbgrader": {"grade_id": "p1_tests", "grade": True, "points": 2}}
    release = {"cells": [{"cell_type": "code", "metadata": answer, "source": "raise NotImplementedError()"},
                         {"cell_type": "code", "metadata": test, "source": "check()"}], "metadata": {}}
    where = f"{sys.prefix}/lib/python3.11/site-packages/torch/functional.py"
    error = {"output_type": "error", "ename": "NotImplementedError", "evalue": "",
             "traceback": [f"File {where}:12, in f", f"File {ROOT}/mpcourse/numerics.py:3"]}
    ran = {"cells": [{**release["cells"][0], "execution_count": 1, "outputs": [error]},
                     {**release["cells"][1], "execution_count": 2, "outputs": [
                         {"output_type": "stream", "name": "stderr", "text": f"{where}:7: UserWarning: x\n"}]},
                     {"cell_type": "code", "metadata": {}, "source": "1 + 1", "execution_count": "7<script>", "outputs": []}]}
    verdicts = {"p1_tests": {"passed": False, "message": "NotImplementedError"}}
    nb = feedback.feedback_notebook(ran, release, {"p1_tests": 2.0}, verdicts)
    assert [c["execution_count"] for c in nb["cells"]] == [1, 2, None]  # a count that is not a small integer: none
    shown = json.dumps(nb)
    assert str(ROOT) not in shown and sys.prefix not in shown and ".../lib/python3.11/site-packages/torch" in shown
    assert "Not attempted: the answer cells of this part are as handed out" in " ".join(nb["cells"][1]["outputs"][-1]["text"].split())
    ran["cells"][0]["source"] = "x = 1\nraise NotImplementedError()"  # attempted, and failing
    note = feedback.feedback_notebook(ran, release, {"p1_tests": 2.0}, verdicts)["cells"][1]["outputs"][-1]["text"]
    assert "Not attempted" not in note and "NotImplementedError" in note


def lms_zip(path: Path, names: dict[str, str | dict]) -> Path:
    """A fabricated LMS download: {name in the zip: the notebook's marker, or {name: marker} for a
    zip a student uploaded}."""
    import io
    import zipfile
    nb = json.loads((ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text())
    with zipfile.ZipFile(path, "w") as archive:
        for name, marker in names.items():
            if isinstance(marker, dict):
                lms_zip(inner := io.BytesIO(), marker)
                archive.writestr(name, inner.getvalue())
            else:
                archive.writestr(name, json.dumps({**nb, "metadata": {**nb["metadata"], "marker": marker}}))
        archive.writestr("doejane_123456_7890123_notes.txt", "not a notebook")
        archive.writestr("alice_333_5002_notes.gz", "not gzip: an archive that stopped every collection")
    return path


def collected(course: Path) -> dict[str, str]:
    return {p.parent.parent.name: json.loads(p.read_text())["metadata"]["marker"]
            for p in (course / "submitted").glob(f"*/{ASSIGNMENT}/*.ipynb")}


def test_a_submission_of_many_files_is_summed_up_and_a_classmates_late_line_stays_in_view(tmp_path):
    """Red team 45g, A10: one Canvas submission of 3,000 notebooks printed two lines for each
    (collection's and nbgrader's), 6,000 lines in which a classmate's LATE line was lost."""
    course = fresh_course(tmp_path / "course")
    names = {f"doejane_late_123456_7890123_{ASSIGNMENT}.ipynb": "jane"}
    names.update({f"mallory_999_888_note{i:03d}.ipynb": f"m{i}" for i in range(3 * collect.NOTES_PER_STUDENT)})
    download = lms_zip(tmp_path / "download.zip", names)
    result = subprocess.run([sys.executable, "-m", "grader", "collect", ASSIGNMENT, "--lms", "canvas",
                             "--zip", str(download), "--course", str(course)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    about = [line for line in result.stdout.splitlines() if "mallory_999" in line and "submissions of" not in line]
    assert len(about) == collect.NOTES_PER_STUDENT + 1, result.stdout
    assert f"mallory_999: {2 * collect.NOTES_PER_STUDENT - 1} more files skipped, not listed" in about[-1]
    assert "LATE: doejane_123456" in result.stdout and set(collected(course)) == {"doejane_123456", "mallory_999"}


@pytest.mark.parametrize("lms, names, expected", [
    ("canvas", {f"doejane_late_123456_7890123_{ASSIGNMENT}.ipynb": "jane first",
                f"doejane_late_123456_7890123_{ASSIGNMENT}-1.ipynb": "jane second",
                f"doejane_late_123456_7890123_{ASSIGNMENT}-2.ipynb": "jane latest",
                f"smithomar_223344_7890456_Copy of {ASSIGNMENT}.ipynb": "omar only",
                f"müllerjürgen_112_5001_{ASSIGNMENT}.ipynb": "jürgen",
                "mallory_222_5001_evil.zip": {f"doejane_1_99999999_{ASSIGNMENT}.ipynb": "mallory's blank",
                                              f"../../mallory_1_2_{ASSIGNMENT}.ipynb": "outside"},
                f"../mallory_1_3_{ASSIGNMENT}.ipynb": "outside",
                f"{'c' * 240}_1_4_{ASSIGNMENT}.ipynb": "a name longer than a file system holds",
                # red team 45b, A03: a classmate with the same name is another student (user id 654321)
                f"doejane_654321_7890999_{ASSIGNMENT}.ipynb": "the other jane",
                # red team 45c, A01: a Canvas name built to read as jane's later submission
                f"doejane_123456_9999999_x_777_7890999_{ASSIGNMENT}.ipynb": "mallory as jane",
                # red team 45d, A11: an honest file name that reads as two uploads: refused, and its student named
                "smithann_1001_5001_hw_3_1_solution.ipynb": "ann's only notebook"},
     {"doejane_123456": "jane latest", "doejane_654321": "the other jane", "smithomar_223344": "omar only",
      "müllerjürgen_112": "jürgen"}),
    ("moodle", {f"Jane Doe_12345_assignsubmission_file_{ASSIGNMENT}.ipynb": "jane first",
                f"Jane Doe_12345_assignsubmission_file_{ASSIGNMENT} (1).ipynb": "jane latest",
                f"Omar Smith_12346_assignsubmission_file_/{ASSIGNMENT}.ipynb": "omar only",
                # red team 45f, A11: a leftover beside the finished notebook sorted last and was graded
                f"Omar Smith_12346_assignsubmission_file_/{ASSIGNMENT}_old.ipynb": "omar's leftover",
                "Omar Smith_12346_assignsubmission_onlinetext_/onlinetext.html": "not a notebook",
                f"Mallory Evil_55555_assignsubmission_file_/Jane Doe_12345_assignsubmission_file_{ASSIGNMENT} (7).ipynb":
                    "mallory's blank",
                # red team 45c, A02: a Moodle name built to read as jane's ninth upload
                f"Jane Doe_12345_assignsubmission_file__67890_assignsubmission_file_x (9).ipynb": "mallory as jane"},
     {"jane_doe_12345": "jane latest", "omar_smith_12346": "omar only"}),
])
def test_an_lms_download_is_collected_latest_upload_per_student(tmp_path, lms, names, expected):
    course = fresh_course(tmp_path / "course")
    download = lms_zip(tmp_path / f"{lms}-download.zip", names)
    result = subprocess.run([sys.executable, "-m", "grader", "collect", ASSIGNMENT, "--lms", lms,
                             "--zip", str(download), "--course", str(course)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert collected(course) == expected
    assert all(p.name == f"{ASSIGNMENT}.ipynb" for p in (course / "submitted").glob("*/*/*"))
    if lms == "canvas":
        assert "LATE: doejane_123456" in result.stdout
        assert "skipped mallory_222_5001_evil.zip: not a notebook" in result.stdout  # never opened
        assert f"skipped ../mallory_1_3_{ASSIGNMENT}.ipynb: its name points outside" in result.stdout
        assert "NOT COLLECTED alice_333: uploaded files, none of them a notebook" in result.stdout  # e.g. zipped
        assert f"skipped {'c' * 240}_1_4_{ASSIGNMENT}.ipynb: cannot be written here (File name too long)" in result.stdout
        # red team 24, A03: that student was told to have uploaded "none of them a notebook"
        assert any(line.startswith(f"  NOT COLLECTED {'c' * 100}") and "their notebook(s) were skipped" in line
                   for line in result.stdout.splitlines()), result.stdout
        assert f"skipped doejane_123456_9999999_x_777_7890999_{ASSIGNMENT}.ipynb: its name reads as more than one" in result.stdout
        assert "NOT COLLECTED smithann_1001: their only notebook(s) were refused (smithann_1001_5001_hw_3_1" in result.stdout
        assert "NOT COLLECTED doejane" not in result.stdout  # the name built to read as hers: she is collected
    else:  # an upload's own name never makes it a classmate's
        assert "mallory_evil_55555: skipped Jane Doe_12345" in result.stdout and "jane_doe_12345's upload" in result.stdout
        assert "skipped Jane Doe_12345_assignsubmission_file__67890_assignsubmission_file_x (9).ipynb: its name reads" in result.stdout
        assert "NOT COLLECTED mallory_evil_55555: their only notebook(s) were refused" in result.stdout
        assert "NOT COLLECTED jane" not in result.stdout
        assert (f"omar_smith_12346: skipped {ASSIGNMENT}_old.ipynb: the same submission holds {ASSIGNMENT}.ipynb, "
                "collected instead") in result.stdout
    assert "skipped alice_333_5002_notes.gz" in result.stdout  # one bad archive stops no one's collection
    assert "Skipped submission with no match information" not in result.stdout  # nbgrader's second line for each
    assert {p.suffix for p in (course / "downloaded").rglob("*") if p.is_file() and p.name != "lms.json"} == {".ipynb"}
    remembered = json.loads((course / "downloaded" / ASSIGNMENT / "lms.json").read_text())  # for the way back
    assert remembered["lms"] == lms and set(remembered["students"]) == set(expected)
    import hashlib
    for student, entry in remembered["students"].items():  # the notebook collected is the file uploaded
        assert entry.pop("sha256") == hashlib.sha256(
            (course / "submitted" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_bytes()).hexdigest()
    if lms == "canvas":
        assert remembered["students"]["doejane_123456"] == {
            "lms_id": "doejane_123456", "user": "123456", "name": "doejane", "late": True,
            "file": f"doejane_late_123456_7890123_{ASSIGNMENT}-2.ipynb", "prefix": "doejane_late_123456_7890123_",
            "uploaded": f"{ASSIGNMENT}-2.ipynb"}
    else:
        assert remembered["students"]["omar_smith_12346"] == {
            "lms_id": "omar_smith_12346", "user": "12346", "name": "Omar Smith", "late": False,
            "file": f"Omar Smith_12346_assignsubmission_file_/{ASSIGNMENT}.ipynb", "uploaded": f"{ASSIGNMENT}.ipynb"}


def test_a_folder_inside_a_moodle_submission_never_makes_its_notebook_a_classmates(tmp_path):
    """Red team 45i, A01: Mallory's Moodle folder held `.../extracted/` folders with notebooks named
    as classmates' flat uploads. The innermost folder named `extracted` was taken for the download's
    root: Carol (no hand-in) was collected with Mallory's notebook, and Bob's own hand-in beside the
    one named as his stopped the whole class's collection (`Duplicate submission file`)."""
    course = fresh_course(tmp_path / "course")
    mallory = "Mallory Evil_111_assignsubmission_file_"
    download = lms_zip(tmp_path / "moodle.zip", {
        f"Alice Ng_100_assignsubmission_file_/{ASSIGNMENT}.ipynb": "alice",
        f"Bob Smith_222_assignsubmission_file_/{ASSIGNMENT}.ipynb": "bob",
        f"{mallory}/{ASSIGNMENT}.ipynb": "mallory",
        f"{mallory}/{ASSIGNMENT}/extracted/Bob Smith_222_assignsubmission_file_{ASSIGNMENT}.ipynb": "mallory as bob",
        f"{mallory}/x/extracted/Carol Ng_333_assignsubmission_file_{ASSIGNMENT}.ipynb": "mallory as carol",
        f"{mallory}/y/extracted/Carol Ng_333_assignsubmission_file_/{ASSIGNMENT}.ipynb": "mallory as carol's folder"})
    result = subprocess.run([sys.executable, "-m", "grader", "collect", ASSIGNMENT, "--lms", "moodle",
                             "--zip", str(download), "--course", str(course)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    # a notebook in a folder of Mallory's is at most hers, ranked with her others, and named in a note
    assert collected(course) == {"alice_ng_100": "alice", "bob_smith_222": "bob",
                                 "mallory_evil_111": "mallory as carol's folder"}
    assert (f"mallory_evil_111: skipped {ASSIGNMENT}/extracted/Bob Smith_222_assignsubmission_file_{ASSIGNMENT}.ipynb: "
            "a file in their submission named as bob_smith_222's upload (refused)") in result.stdout
    assert "named as carol_ng_333's upload (refused)" in result.stdout
    assert (f"mallory_evil_111: skipped {ASSIGNMENT}.ipynb: the same submission holds "
            f"y/extracted/Carol Ng_333_assignsubmission_file_/{ASSIGNMENT}.ipynb, collected instead") in result.stdout
    assert "NOT COLLECTED carol" not in result.stdout and "NOT COLLECTED bob" not in result.stdout
    assert "Canvas" not in result.stdout  # a Moodle download's note names no Canvas file id (walkthrough 47c)


def test_a_canvas_submission_of_the_work_and_the_untouched_release_is_collected_with_the_work(tmp_path):
    """Red team 45i, A03: Canvas names each file of one submission with its own file id
    (`doejane_123456_7890123_Copy of ...`, `doejane_123456_7890124_...`); the higher id was taken
    as the later submission before the work-first rule applied, and the untouched release was
    collected (0 marks). Whichever file has the higher id, the work is collected."""
    import zipfile
    course = fresh_course(tmp_path / "course")
    release = json.loads((ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text())
    work = json.loads(json.dumps(release))
    answer = next(c for c in work["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    answer["source"] = "scale = 2.0 ** 16  # the work\n"
    work["metadata"]["marker"] = "work"
    with zipfile.ZipFile(download := tmp_path / "canvas.zip", "w") as archive:
        archive.writestr(f"doejane_123456_7890123_Copy of {ASSIGNMENT}.ipynb", json.dumps(work))
        archive.writestr(f"doejane_123456_7890124_{ASSIGNMENT}.ipynb", json.dumps(release))
        archive.writestr(f"smithomar_223344_7890200_{ASSIGNMENT}.ipynb", json.dumps(release))
        archive.writestr(f"smithomar_223344_7890201_Copy of {ASSIGNMENT}.ipynb", json.dumps(work))
    result = subprocess.run([sys.executable, "-m", "grader", "collect", ASSIGNMENT, "--lms", "canvas",
                             "--zip", str(download), "--course", str(course)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    for student in ("doejane_123456", "smithomar_223344"):
        taken = json.loads((course / "submitted" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text())
        assert taken["metadata"].get("marker") == "work", student
    assert (f"doejane_123456: skipped doejane_123456_7890124_{ASSIGNMENT}.ipynb, as handed out (no answer changed): "
            f"the same submission holds doejane_123456_7890123_Copy of {ASSIGNMENT}.ipynb, with work in it, "
            "collected instead") in result.stdout
    assert "an earlier upload" not in result.stdout
    remembered = json.loads((course / "downloaded" / ASSIGNMENT / "lms.json").read_text())["students"]
    assert remembered["doejane_123456"]["prefix"] == "doejane_123456_7890123_"  # feedback goes back to that file


# The documented formats, written out here, not taken from grader/lms.py. Canvas's grade import:
# the identifying columns, then one column per assignment, and the optional "Points Possible" row
# of Canvas's own export. Moodle's offline grading worksheet: rows found by "Identifier"
# ("Participant " and the download's number), "Grade", and "Last modified (grade)" (read by PHP's
# strtotime). Canvas's re-upload of files: the first two all-digit parts of a name, split at "_",
# are the user and the submitted file. Moodle's feedback zip: a path part split at "_" into at most
# five pieces, the second the participant number, the third and fourth the plugin.
CANVAS_IMPORT = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_WORKSHEET = ["Identifier", "Full name", "Grade", "Maximum Grade", "Last modified (grade)"]


@pytest.fixture(scope="module")
def registered_course(tmp_path_factory):
    """A fresh course with ASSIGNMENT in its gradebook (nbgrader generate_assignment, once): copied by each test."""
    course = fresh_course(tmp_path_factory.mktemp("registered") / "course")
    gradebook.register(course, ASSIGNMENT)
    return course


@pytest.mark.parametrize("lms, uploads", [
    ("canvas", [f"doejane_late_123456_7890123_{ASSIGNMENT}-2.ipynb", f"smithomar_223344_7890456_Copy of {ASSIGNMENT}.ipynb",
                f"leebo_4455_7777_{ASSIGNMENT}.ipynb"]),
    ("moodle", [f"Jane Doe_12345_assignsubmission_file_/{ASSIGNMENT}.ipynb",
                f"Omar Smith_12346_assignsubmission_file_{ASSIGNMENT} (1).ipynb", f"Bo Lee_12347_assignsubmission_file_{ASSIGNMENT}.ipynb"]),
])
def test_grades_and_feedback_go_back_in_the_files_each_lms_imports(registered_course, tmp_path, capsys, lms, uploads):
    """Issue 47: `export --lms` and `pack-feedback --lms` from what collection remembered of the
    download's names: Jane graded with a page, Omar graded without one, Bo collected and not graded,
    and a student put in by hand, graded and not collected."""
    import csv
    import datetime
    import zipfile

    from grader import collect
    from grader.__main__ import main
    import shutil
    course = Path(shutil.copytree(registered_course, tmp_path / "course"))
    parse = {"canvas": collect.canvas, "moodle": collect.moodle}[lms]
    collect.remember(course, ASSIGNMENT, lms, {parse(Path(n))["student_id"]: (Path(n), parse(Path(n))) for n in uploads})
    jane, omar, bo = [parse(Path(n)) for n in uploads]
    points = fabricate.test_points(ASSIGNMENT)
    given = {jane["student_id"]: dict(points), omar["student_id"]: {t: (p if k == 0 else 0.0) for k, (t, p) in enumerate(points.items())},
             "byhand": dict(points)}
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning
    with Gradebook(gradebook.db_url(course)) as book, warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=SAWarning)  # nbgrader's API's order of adding rows (schedule.grade)
        for student, scores in given.items():
            gradebook.write_grades(book, ASSIGNMENT, student, scores)
    page = course / "feedback" / jane["student_id"] / ASSIGNMENT / f"{ASSIGNMENT}.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html>Jane's feedback</html>")

    main(["export", ASSIGNMENT, "--lms", lms, "--course", str(course)])
    main(["pack-feedback", ASSIGNMENT, "--lms", lms, "--course", str(course)])
    said = capsys.readouterr().out
    with open(course / f"grades-{ASSIGNMENT}-{lms}.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    archive = zipfile.ZipFile(course / "feedback-upload" / f"{ASSIGNMENT}-feedback-{lms}.zip")
    assert [archive.read(n) for n in archive.namelist()] == [page.read_bytes()]  # Omar and Bo: no page
    total = {s: sum(v.values()) for s, v in given.items()}
    if lms == "canvas":
        assert list(rows[0])[:5] == CANVAS_IMPORT and list(rows[0])[5:] == [ASSIGNMENT]
        assert rows[0]["Student"].strip() == "Points Possible" and float(rows[0][ASSIGNMENT]) == sum(points.values())
        assert {r["ID"]: float(r[ASSIGNMENT]) for r in rows[1:]} == {"123456": total[jane["student_id"]],
                                                                     "223344": total[omar["student_id"]]}
        assert [[t for t in n.split("_") if t.isdigit()][:2] for n in archive.namelist()] == [["123456", "7890123"]]
        assert "LATE: doejane_123456" in said
    else:
        assert set(MOODLE_WORKSHEET) <= set(rows[0])
        assert {r["Identifier"]: (float(r["Grade"]), float(r["Maximum Grade"])) for r in rows} == {
            "Participant 12345": (total[jane["student_id"]], sum(points.values())),
            "Participant 12346": (total[omar["student_id"]], sum(points.values()))}
        assert {r["Full name"] for r in rows} == {"Jane Doe", "Omar Smith"}
        assert all(datetime.datetime.strptime(r["Last modified (grade)"], "%A, %d %B %Y, %I:%M %p") for r in rows)
        folder, name = archive.namelist()[0].split("/")
        assert folder.split("_", 4)[1:4] == ["12345", "assignfeedback", "file"] and name.endswith(".html")
    assert f"NOT EXPORTED {bo['student_id']}: collected, but no grade" in said
    assert f"points out of {sum(points.values()):g}: give the {lms} assignment {sum(points.values()):g} as its" in said
    assert "NOT EXPORTED byhand: graded, but not collected" in said
    assert f"NO FEEDBACK for {omar['student_id']}" in said and f"NO FEEDBACK for {bo['student_id']}" in said
    with pytest.raises(SystemExit, match="was not collected from"):
        main(["export", ASSIGNMENT, "--lms", "moodle" if lms == "canvas" else "canvas", "--course", str(course)])
    main(["pack-feedback", ASSIGNMENT, "--lms", lms, "--course", str(course), "--student", omar["student_id"]])
    assert zipfile.ZipFile(course / "feedback-upload" / f"{ASSIGNMENT}-feedback-{lms}-some.zip").namelist() == []  # his alone
    assert [archive.read(n) for n in archive.namelist()] == [page.read_bytes()]  # the class's zip kept (walkthrough 47e, 4)
    said = capsys.readouterr().out
    assert f"NO FEEDBACK for {omar['student_id']}" in said and f"{ASSIGNMENT}-feedback-{lms}-some.zip" in said
    if lms == "canvas":  # the column named once is the column of every later export (walkthrough 47b, K4)
        main(["export", ASSIGNMENT, "--lms", lms, "--course", str(course), "--column", "Exercise 2 (4407)"])
        main(["export", ASSIGNMENT, "--lms", lms, "--course", str(course)])
        with open(course / f"grades-{ASSIGNMENT}-{lms}.csv", newline="", encoding="utf-8") as f:
            assert list(csv.DictReader(f).fieldnames)[5:] == ["Exercise 2 (4407)"]
        assert "column 'Exercise 2 (4407)', as the last export named it" in capsys.readouterr().out


def test_the_nbgrader_export_leaves_an_assignment_never_handed_in_without_a_score(registered_course, tmp_path, capsys):
    """Walkthrough 3 (issue 48): nbgrader's export wrote 0.0 for an assignment a student never
    handed in, the same as a graded zero. Jane is graded 0 in every part; Bo is in the gradebook
    and never handed it in."""
    import csv
    import shutil

    from grader.__main__ import main
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning
    course = Path(shutil.copytree(registered_course, tmp_path / "course"))
    with Gradebook(gradebook.db_url(course)) as book, warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=SAWarning)
        gradebook.write_grades(book, ASSIGNMENT, "jane", {t: 0.0 for t in fabricate.test_points(ASSIGNMENT)})
        book.update_or_create_student("bo")
    main(["export", "--course", str(course), "--to", str(tmp_path / "grades.csv")])
    with open(tmp_path / "grades.csv", newline="", encoding="utf-8") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"jane", "bo"}
    assert float(rows["jane"]["score"]) == 0.0 and float(rows["jane"]["raw_score"]) == 0.0
    assert rows["bo"]["score"] == rows["bo"]["raw_score"] == "" and float(rows["bo"]["max_score"]) > 0
    assert f"1 row left without a score: assignments never handed in or not graded yet, e.g. {ASSIGNMENT} of bo" \
        in capsys.readouterr().out


def test_an_id_longer_than_the_gradebook_holds_is_shortened_alike_on_every_run_and_database(tmp_path):
    """Red team A9: a 200-character Canvas login crashed `prepare` on PostgreSQL (varchar(128)),
    which SQLite took: the two gradebooks differed."""
    course = fresh_course(tmp_path / "course")
    long = "a" * 200
    download = lms_zip(tmp_path / "canvas.zip", {f"{long}_1_99_{ASSIGNMENT}.ipynb": "long",
                                                 f"{long}b_1_98_{ASSIGNMENT}.ipynb": "longer",
                                                 f"doejane_111_5000_{ASSIGNMENT}.ipynb": "jane"})
    line = [sys.executable, "-m", "grader", "collect", ASSIGNMENT, "--lms", "canvas", "--zip", str(download),
            "--course", str(course)]
    results = [subprocess.run(line, cwd=ROOT, capture_output=True, text=True) for _ in range(2)]
    assert all(r.returncode == 0 for r in results), results[-1].stdout + results[-1].stderr
    ids = collected(course)
    assert sorted(ids.values()) == ["jane", "long", "longer"] and len(ids) == 3  # nothing stacked under a second id
    shortened = [s for s in ids if s != "doejane_111"]
    assert all(len(s) == 128 and s.startswith("a" * 100) for s in shortened)
    assert f"LONG ID: {long}_1 is collected as {[s for s in ids if ids[s] == 'long'][0]}" in results[-1].stdout
    from nbgrader.api import Gradebook
    urls = {"sqlite": None}
    with contextlib.ExitStack() as stack:
        if postgres.problem() is None:
            urls["postgresql"] = stack.enter_context(postgres.Server()).database("gradebook")
        for url in urls.values():
            assert gradebook.prepare(course, ASSIGNMENT, url) == sorted(ids)
            with Gradebook(gradebook.db_url(course, url)) as book:
                assert sorted(s.id for s in book.students) == sorted(ids)
    by_hand = course / "submitted" / ("z" * 129) / ASSIGNMENT  # not through collect: refused, named
    by_hand.mkdir(parents=True)
    (by_hand / f"{ASSIGNMENT}.ipynb").write_text("{}")
    refused = subprocess.run([sys.executable, "-m", "grader", "prepare", ASSIGNMENT, "--course", str(course)],
                             cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    assert f"longer than the gradebook's 128 characters in {course / 'submitted'}: {'z' * 129}. Rename" in refused.stderr


def test_the_sandboxes_gradebook_is_their_own_whatever_gradebook_the_course_names(tmp_path, monkeypatch):
    """Issue 47: the guide's first PostgreSQL option (the address in nbgrader_config.py) reached the
    feedback run's sandbox, which reaches no server: every feedback page lost its outputs. The
    template course each sandbox gets writes its own SQLite gradebook, and making it touches no other."""
    from traitlets.config.loader import PyFileConfigLoader
    config = tmp_path / "repository"
    config.mkdir()
    unreachable = "postgresql+psycopg://grader@127.0.0.1:1/mpcourse_grades"
    (config / "nbgrader_config.py").write_text((ROOT / "nbgrader_config.py").read_text().replace(
        'c.CourseDirectory.db_url = "sqlite:///gradebook.db"', f'c.CourseDirectory.db_url = "{unreachable}"'))
    assert unreachable in (config / "nbgrader_config.py").read_text()
    monkeypatch.setattr(runs, "ROOT", config)
    template = runs.template_course(fresh_course(tmp_path / "course"), ASSIGNMENT, tmp_path / "scratch")
    loaded = PyFileConfigLoader("nbgrader_config.py", path=str(template)).load_config()
    assert loaded.CourseDirectory.db_url == "sqlite:///gradebook.db"  # the sandbox's course folder's
    assert gradebook.registered(template, ASSIGNMENT, f"sqlite:///{template / 'gradebook.db'}")


def test_collection_reads_the_download_once_however_many_files_a_submission_holds(tmp_path, monkeypatch):
    """Red team 45b, A10: each file's collection read every file of the download again (1,000
    files in one submission: 56 s, 2,000: 504 s, everyone's collection waiting)."""
    from grader import collect
    extracted = tmp_path / "downloaded" / ASSIGNMENT / "extracted"
    extracted.mkdir(parents=True)
    names = [f"doejane_1001_500001_part{i:04d}.ipynb" for i in range(300)] + [f"smithomar_3003_500003_{ASSIGNMENT}.ipynb"]
    for name in names:
        (extracted / name).write_text("{}")
    read = []
    monkeypatch.setattr(collect.CanvasCollector, "parse", staticmethod(lambda path: read.append(path) or collect.canvas(path)))
    collector = collect.CanvasCollector()
    kept = [info for name in names if (info := collector.collect(str(extracted / name)))]
    assert kept == [{"student_id": "doejane_1001", "file_id": f"{ASSIGNMENT}.ipynb"},
                    {"student_id": "smithomar_3003", "file_id": f"{ASSIGNMENT}.ipynb"}]
    assert len(read) == 2 * len(names)  # each file's name read for itself and once for the index


def test_collect_imports_no_nbgrader_and_the_guides_collector_names_still_resolve():
    """Issue 52: `python -m grader collect` imported nbgrader (about a second of CPU a command) only
    to subclass its plugin; the plugins live in grader/collectors.py, imported by zip_collect's own
    process, and the instructor guide's `--collector=grader.collect.CanvasCollector` finds them."""
    probe = ("import sys\nimport grader.collect\nprint('nbgrader' in sys.modules)\n"
             "from grader import collect, collectors\n"
             "print(collect.CanvasCollector is collectors.CanvasCollector, collect.MoodleCollector is collectors.MoodleCollector)")
    said = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert said.returncode == 0, said.stderr[-2000:]
    assert said.stdout.split() == ["False", "True", "True"], said.stdout
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        collect.Nothing  # noqa: B018


@needs_sandbox
def test_from_a_fresh_clone_to_returnable_feedback_as_the_guide_says(tmp_path):
    """The guide's path on a course whose gradebook never heard of the assignment: a Canvas
    download collected, graded, feedback packed, grades exported; each step a command."""
    import zipfile
    course = fresh_course(tmp_path / "course")
    release = (course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text()
    scratch = fresh_course(tmp_path / "scratch")
    full = fabricate.solution_cells(ASSIGNMENT)
    setup = next(notebooks.source_text(c) for c in notebooks.read_notebook(
        course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")["cells"] if notebooks.grade_id(c) == "setup")
    # Jane's import in the set-up cell, which her Part 1 uses: graded with it, and her page ran it
    # too (student walkthrough 48g, D2: the feedback run put the set-up cell back as handed out)
    full = {**full, "setup": setup + "\nfrom math import pi as PI_OF_MY_SETUP\n",
            "p1_solution": "assert PI_OF_MY_SETUP > 3\n" + full["p1_solution"]}
    fabricate.write_submission(scratch, ASSIGNMENT, "full", full)
    fabricate.write_submission(scratch, ASSIGNMENT, "blank", {})
    with zipfile.ZipFile(tmp_path / "submissions.zip", "w") as archive:
        for login, kind, name in (("doejane_late_123456_7890123", "full", f"{ASSIGNMENT}.ipynb"),
                                  ("smithomar_223344_7890456", "blank", f"Copy of {ASSIGNMENT}.ipynb")):  # Colab's
            archive.write(scratch / "submitted" / kind / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", f"{login}_{name}")
    env = {**os.environ, gradebook.SECRET_VARIABLE: "a-test-secret-of-at-least-32-characters", "PYTHONPATH": str(ROOT)}  # `python -m grader` from the course

    def step(*args):
        result = subprocess.run([sys.executable, "-m", "grader", *args], cwd=course, env=env,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Traceback" not in result.stderr and "SAWarning" not in result.stderr, result.stderr
        return result.stdout

    step("collect", ASSIGNMENT, "--lms", "canvas", "--zip", str(tmp_path / "submissions.zip"), "--course", ".")
    assert not gradebook.registered(course, ASSIGNMENT)
    graded = step("grade", ASSIGNMENT, "--course", ".", "--timeout", "20")
    assert f"note on smithomar_223344: graded 'Copy of {ASSIGNMENT}.ipynb', as uploaded to the LMS" in graded  # C4
    points = fabricate.test_points(ASSIGNMENT)
    results = step("results", ASSIGNMENT, "--course", ".")  # the class's table again, from the gradebook (C6)
    assert [line.split()[-1] for line in results.splitlines() if line.startswith(("doejane", "smithomar"))] == [
        f"{sum(points.values()):g}", "0"]
    assert "  smithomar_223344 p1_tests failed: " in results and "2 students graded in" in results
    assert gradebook.scores(course, ASSIGNMENT) == {"doejane_123456": points, "smithomar_223344": {t: 0.0 for t in points}}
    assert (course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text() == release
    step("pack-feedback", ASSIGNMENT, "--course", ".", "--out", "feedback-upload")
    page = (course / "feedback-upload" / ASSIGNMENT / f"smithomar_223344_{ASSIGNMENT}.html").read_text()
    assert "Not attempted: the answer cells of this part are as handed out" in " ".join(page.split())  # a blank notebook
    assert f"This page grades the notebook 'Copy of {ASSIGNMENT}.ipynb' of your submission" in page  # as uploaded (C4)
    assert "In&nbsp;[&nbsp;]" not in page and "In [ ]" not in page  # the run's counts
    assert ">Test cell</a>" not in page and "Grade cell:" not in page  # nbgrader's words (walkthrough 3)
    assert '<a href="#p1_tests">Part 1</a> (Score:' in page and "Tests of Part 1" in page
    assert "cdnjs" not in page and "x-mathjax-config" not in page and "<script" not in page  # nothing loads (C5)
    assert "2⁻²⁵" in page and "$2^{-25}$" not in page  # maths readable offline, without MathJax
    janes = (course / "feedback-upload" / ASSIGNMENT / f"doejane_123456_{ASSIGNMENT}.html").read_text()
    assert "NameError" not in janes and notebooks.OWN_SETUP.split(":")[0] in janes
    if CHROMIUM:  # as a student sees it, offline: the verdict not cut, the code as written, no line cut
        seen = in_the_browser(course / "feedback-upload" / ASSIGNMENT / f"smithomar_223344_{ASSIGNMENT}.html")
        assert seen["verdicts"] and not any(seen["verdicts"]), "a verdict scrolls sideways"
        assert "0 < backoff_factor < 1" in seen["text"] and "2⁻²⁵" in seen["text"] and "&lt;" not in seen["text"]
        narrow = in_the_browser(course / "feedback-upload" / ASSIGNMENT / f"doejane_123456_{ASSIGNMENT}.html", width=520)
        assert narrow["code"] and not any(narrow["code"]), "a code line is cut at the page's edge"
    step("export", "--course", ".", "--to", "grades.csv")
    rows = (course / "grades.csv").read_text().splitlines()
    assert len(rows) == 3 and any(row.startswith(f"{ASSIGNMENT},") and "doejane_123456" in row for row in rows)
    # Back into Canvas (issue 47): the grade import's CSV and the re-upload's zip, keyed by Canvas's ids
    said = step("export", ASSIGNMENT, "--course", ".", "--lms", "canvas") + step(
        "pack-feedback", ASSIGNMENT, "--course", ".", "--lms", "canvas")
    canvas = (course / f"grades-{ASSIGNMENT}-canvas.csv").read_text().splitlines()
    assert canvas[0].startswith("Student,ID,SIS User ID,SIS Login ID,Section,") and len(canvas) == 4
    assert f"doejane,123456,,,,{sum(points.values()):g}" in canvas and "smithomar,223344,,,,0" in canvas
    assert "LATE: doejane_123456" in said
    assert sorted(zipfile.ZipFile(course / "feedback-upload" / f"{ASSIGNMENT}-feedback-canvas.zip").namelist()) == [
        f"doejane_late_123456_7890123_{ASSIGNMENT}_feedback.html", f"smithomar_223344_7890456_{ASSIGNMENT}_feedback.html"]


@needs_sandbox
@pytest.mark.skipif(postgres.problem() is not None, reason=f"no PostgreSQL here: {postgres.problem()}")
def test_a_moodle_download_graded_by_two_shards_goes_back_as_moodle_takes_it(tmp_path, monkeypatch, capsys):
    """Issue 47, the guide's path for a large class: a Moodle download collected, the assignment
    prepared in PostgreSQL, two shards grading a student each, then the worksheet and the feedback
    zip for Moodle, each step the guide's command."""
    import csv
    import zipfile

    from grader.__main__ import main
    monkeypatch.setenv(gradebook.SECRET_VARIABLE, "a-test-secret-of-at-least-32-characters")
    course, scratch = fresh_course(tmp_path / "course"), fresh_course(tmp_path / "scratch")
    fabricate.write_submission(scratch, ASSIGNMENT, "full", fabricate.solution_cells(ASSIGNMENT))
    fabricate.write_submission(scratch, ASSIGNMENT, "blank", {})
    ana = next(n for n in range(5501000, 5502000) if schedule.in_shard(f"ana_garcía_{n}", (1, 2)))
    bo = next(n for n in range(5502000, 5503000) if schedule.in_shard(f"bo_lee_{n}", (2, 2)))
    with zipfile.ZipFile(tmp_path / "moodle.zip", "w") as archive:
        for folder, kind, name in ((f"Ana García_{ana}", "full", f"{ASSIGNMENT}.ipynb"),
                                   (f"Bo Lee_{bo}", "blank", f"Copy of {ASSIGNMENT}.ipynb")):
            archive.write(scratch / "submitted" / kind / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
                          f"{folder}_assignsubmission_file_/{name}")
    main(["collect", ASSIGNMENT, "--lms", "moodle", "--zip", str(tmp_path / "moodle.zip"), "--course", str(course)])
    points = fabricate.test_points(ASSIGNMENT)
    with postgres.Server() as server:
        url = server.database("gradebook")
        on = ["--course", str(course), "--db-url", url]
        main(["prepare", ASSIGNMENT, *on])
        for shard, pages in (("1/2", ["--no-feedback"]), ("2/2", [])):  # one page is enough for the zip's layout
            main(["grade", ASSIGNMENT, *on, "--shard", shard, "--jobs", "1", "--timeout", "20", *pages])
            assert "1 student graded in" in capsys.readouterr().err  # each shard its own student
        main(["export", ASSIGNMENT, "--lms", "moodle", *on])
        main(["pack-feedback", ASSIGNMENT, "--lms", "moodle", *on])
        assert gradebook.scores(None, ASSIGNMENT, url) == {f"ana_garcía_{ana}": points,
                                                           f"bo_lee_{bo}": {t: 0.0 for t in points}}
    said = capsys.readouterr().out
    with open(course / f"grades-{ASSIGNMENT}-moodle.csv", newline="", encoding="utf-8") as f:
        rows = {r["Identifier"]: (r["Full name"], float(r["Grade"])) for r in csv.DictReader(f)}
    assert rows == {f"Participant {ana}": ("Ana García", sum(points.values())), f"Participant {bo}": ("Bo Lee", 0.0)}
    assert f"points out of {sum(points.values()):g}" in said
    assert f"NO FEEDBACK for ana_garcía_{ana}" in said
    names = zipfile.ZipFile(course / "feedback-upload" / f"{ASSIGNMENT}-feedback-moodle.zip").namelist()
    assert [n.split("/")[0].split("_", 4)[:4] for n in names] == [["Bo Lee", str(bo), "assignfeedback", "file"]]


@pytest.mark.parametrize("lms", ["canvas", "moodle"])
def test_a_name_that_reads_as_a_formula_is_exported_inert(tmp_path, monkeypatch, lms):
    """Red team 45f, A04: a Moodle full name `=SUM(1+41)` went into the grade worksheet verbatim,
    a formula for the spreadsheet the instructor opens it in."""
    import csv
    from grader import lms as lmses
    monkeypatch.setattr(lmses, "collected", lambda course, assignment, lms: {
        "mallory": {"name": "=SUM(1+41)", "user": "5", "late": False, "file": "x.ipynb"},
        "bob": {"name": "Bob Ray", "user": "6", "late": False, "file": "y.ipynb"}})
    monkeypatch.setattr(lmses, "scores", lambda course, assignment, url: {"mallory": {"p1": 1.0}, "bob": {"p1": 2.0}})
    monkeypatch.setattr(lmses, "db_url", lambda course, url: None)
    monkeypatch.setattr(lmses, "maximum", lambda course, assignment: 10.0)
    monkeypatch.setattr(lmses, "refuse_not_current", lambda *args: None)  # no gradebook here
    lmses.export_grades(tmp_path, ASSIGNMENT, lms, tmp_path / "grades.csv")
    names = {row[0] if lms == "canvas" else row[1] for row in csv.reader((tmp_path / "grades.csv").open())}
    assert "'=SUM(1+41)" in names and "Bob Ray" in names and "=SUM(1+41)" not in names


def test_a_moodle_name_that_is_not_utf8_stops_no_export_or_pack(registered_course, tmp_path, capsys):
    """Red team 16c, A03: a folder download whose Moodle folder name held Latin-1 bytes (`Jos\\xe9`)
    stopped `export --lms moodle` and `pack-feedback --lms moodle` for the whole class (the name
    could not be written as UTF-8), leaving a partial worksheet and zip."""
    import csv
    import shutil
    import zipfile

    from grader.__main__ import main
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning
    course = Path(shutil.copytree(registered_course, tmp_path / "course"))
    jose = os.fsdecode(b"Jos\xe9 Garc\xeda")
    names = [f"{person}_{user}_assignsubmission_file_/{ASSIGNMENT}.ipynb"
             for person, user in (("Ann Lee", 5501001), (jose, 5501002), ("Zed Zu", 5501003))]
    uploads = {collect.moodle(Path(n))["student_id"]: (Path(n), collect.moodle(Path(n))) for n in names}
    collect.remember(course, ASSIGNMENT, "moodle", uploads)
    points = fabricate.test_points(ASSIGNMENT)
    with Gradebook(gradebook.db_url(course)) as book, warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=SAWarning)
        for student in uploads:
            gradebook.write_grades(book, ASSIGNMENT, student, dict(points))
            page = course / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html"
            page.parent.mkdir(parents=True)
            page.write_text(f"<html>{student}</html>")
    main(["export", ASSIGNMENT, "--lms", "moodle", "--course", str(course)])
    main(["pack-feedback", ASSIGNMENT, "--lms", "moodle", "--course", str(course)])
    with open(course / f"grades-{ASSIGNMENT}-moodle.csv", newline="", encoding="utf-8") as f:
        rows = {r["Identifier"]: r["Full name"] for r in csv.DictReader(f)}
    assert rows == {"Participant 5501001": "Ann Lee", "Participant 5501002": "Jos\ufffd Garc\ufffda",
                    "Participant 5501003": "Zed Zu"}
    members = zipfile.ZipFile(course / "feedback-upload" / f"{ASSIGNMENT}-feedback-moodle.zip").namelist()
    assert [m.split("_")[1] for m in members] == ["5501001", "5501002", "5501003"], members
    stored = json.loads((course / "downloaded" / ASSIGNMENT / collect.LMS_FILE).read_text(encoding="utf-8"))
    assert stored["students"]["jos_garc_a_5501002"]["name"] == "Jos\ufffd Garc\ufffda"  # text, as written


def test_a_grade_written_without_feedback_is_never_packed_with_the_earlier_page(registered_course, tmp_path, capsys):
    """Red team 16c, A08: Bob's re-submission graded with `grade --no-feedback` (100 %) left his
    page of the earlier grade (0 %), and both `pack-feedback` and `pack-feedback --lms` packed it
    as his, with no word."""
    import shutil
    import zipfile

    from grader.__main__ import main
    from nbgrader.api import Gradebook
    course = Path(shutil.copytree(registered_course, tmp_path / "course"))
    name = f"bobbob_1002_3005_{ASSIGNMENT}.ipynb"
    collect.remember(course, ASSIGNMENT, "canvas", {"bobbob_1002": (Path(name), collect.canvas(Path(name)))})
    page = course / "feedback" / "bobbob_1002" / ASSIGNMENT / f"{ASSIGNMENT}.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html>bob: 0%</html>")  # the page of his earlier grade
    gradebook.prepare(course, ASSIGNMENT)
    main(["pack-feedback", ASSIGNMENT, "--course", str(course), "--out", str(tmp_path / "upload")])  # the earlier page
    assert (tmp_path / "upload" / ASSIGNMENT / f"bobbob_1002_{ASSIGNMENT}.html").read_text() == "<html>bob: 0%</html>"
    points = fabricate.test_points(ASSIGNMENT)
    release = json.loads((course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text())
    with Gradebook(gradebook.db_url(course)) as book, warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        gradebook.record(book, course, ASSIGNMENT, "bobbob_1002", ({t: {"passed": True} for t in points}, release, None,
                                                                   None, {}), points, release, schedule.Report(),
                         secrets=["s"], hidden_lines=set(), feedback=False)  # grade --no-feedback
    assert gradebook.scores(course, ASSIGNMENT) == {"bobbob_1002": points}
    for lms in (["--lms", "canvas"], []):
        main(["pack-feedback", ASSIGNMENT, *lms, "--course", str(course), "--out", str(tmp_path / "upload")])
        said = capsys.readouterr().out
        assert "NO FEEDBACK for bobbob_1002: no page of their current grade" in said and "--no-feedback" in said, said
    assert zipfile.ZipFile(tmp_path / "upload" / f"{ASSIGNMENT}-feedback-canvas.zip").namelist() == []
    assert not list((tmp_path / "upload" / ASSIGNMENT).iterdir())  # the earlier page removed (red team 16d, F)


def test_set_aside_moves_what_collecting_and_grading_an_assignment_wrote_and_nothing_else(tmp_path, capsys):
    """Instructor walkthrough 47e: starting over for a second class meant moving seven path patterns
    by hand (a missed submitted/*/A mixes the two classes)."""
    from grader.__main__ import main
    course, other = tmp_path / "course", "ex1_precision_comparison"
    mine = [f"submitted/ana/{ASSIGNMENT}/{ASSIGNMENT}.ipynb", f"downloaded/{ASSIGNMENT}/archive/x.zip",
            f"autograded/ana/{ASSIGNMENT}/{ASSIGNMENT}.ipynb", f"feedback/ana/{ASSIGNMENT}/{ASSIGNMENT}.html",
            f"feedback-upload/{ASSIGNMENT}-feedback-canvas.zip", "grades.csv", f"grades-{ASSIGNMENT}-canvas.csv"]
    kept = [f"submitted/ana/{other}/{other}.ipynb", f"submitted/bo/{other}/{other}.ipynb", "gradebook.db",
            ".grading-secret", f"source/{ASSIGNMENT}/{ASSIGNMENT}.ipynb", f"grades-{other}-moodle.csv"]
    for name in mine + kept:
        (course / name).parent.mkdir(parents=True, exist_ok=True)
        (course / name).write_text(name)
    (course / "submitted" / "cy" / ASSIGNMENT).mkdir(parents=True)  # a student with only this assignment
    main(["set-aside", ASSIGNMENT, "--to", str(tmp_path / "aside"), "--course", str(course)])
    assert f"8 paths of {ASSIGNMENT} moved" in capsys.readouterr().out
    assert all((tmp_path / "aside" / name).read_text() == name for name in mine)
    assert all((course / name).read_text() == name for name in kept)
    assert not (course / "submitted" / "cy").exists() and (course / "submitted" / "ana" / other).is_dir()
    for to in (tmp_path / "aside", course / "submitted" / "old"):  # not over an earlier set-aside; not where grading writes
        with pytest.raises(SystemExit, match="set-aside"):
            main(["set-aside", other, "--to", str(to), "--course", str(course)])
    assert (course / "submitted" / "ana" / other / f"{other}.ipynb").exists()


def test_the_hint_to_grade_again_names_the_gradebook_given_without_its_password(monkeypatch):
    """Instructor walkthrough 47f, C1: with the gradebook given by --db-url only, `export` said
    "Grade them first: python -m grader grade A", which, run as printed, grades into gradebook.db."""
    monkeypatch.setattr(gradebook, "not_current", lambda course, assignment, url: {"ann": "handed in again"})
    url = "postgresql+psycopg://grader:s3cret@127.0.0.1:55432/grades"
    with pytest.raises(ValueError) as refused:
        gradebook.refuse_not_current(Path("."), ASSIGNMENT, url, "exported", {"ann"})
    said = str(refused.value)
    assert f"python -m grader grade {ASSIGNMENT} --db-url postgresql+psycopg://grader" in said and "s3cret" not in said
    with pytest.raises(ValueError, match=rf"grade {ASSIGNMENT}$"):
        gradebook.refuse_not_current(Path("."), ASSIGNMENT, None, "exported", {"ann"})

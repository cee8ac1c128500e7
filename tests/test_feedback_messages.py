"""A failure message read where it is shown (student walkthrough 48f, B and C): each place cuts it at
its own length, says where ("[...]"), and keeps the grader's note whole; the part's own failure comes
before the errors of other parts' cells; the notebook's own cells are not called the student's."""
import ast
import hashlib
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

from grader import advice, feedback, feedback_page, report, results

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "grader" / "hidden_tests.py"
NOTE = ("your code reads S, which the test cells of Parts 2 and 4 set: ... Set it in a cell of your own, "
        "or use your function's arguments instead")
LONG = ("your cell p2_solution raised NameError: name 'FP16' is not defined; " * 8).strip()


def runner():
    """grader/hidden_tests.py as a module (it imports no_threads from beside it)."""
    sys.path.insert(0, str(RUNNER.parent))
    try:
        spec = importlib.util.spec_from_file_location("hidden_tests_under_test", RUNNER)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(RUNNER.parent))


def test_each_cut_says_where_it_cut_and_keeps_the_graders_note():
    message = f"{LONG}{report.NOTE}{NOTE}"
    for limit in (20, 300, 2000):
        shown = report.shortened(message, limit)
        assert shown.endswith(f"{report.NOTE}{NOTE}"), (limit, shown)
        assert (report.CUT + report.NOTE in shown) == (len(LONG) > limit)
    assert report.shortened("short", 300) == "short" and report.shortened("x" * 400, 300) == "x" * 300 + report.CUT
    forged = "a" + report.NOTE + "b" * 5000  # a student's text posing as a note is kept within bounds
    assert len(report.shortened(forged, 300)) < 300 + report.NOTE_CHARS + 50


def test_the_feedback_page_keeps_the_note_past_its_300_characters_and_four_lines():
    message = f"{LONG}\nline 2\nline 3\nline 4\nline 5{report.NOTE}{NOTE}"
    shown = feedback.safe_message(message, secrets=["sekrit"], hidden_lines=set())
    assert shown.endswith(report.NOTE + NOTE) and shown.startswith(LONG[:100]) and "[...]" in shown
    assert "line 5" not in shown
    text = " ".join(feedback_page.verdict(True, False, shown, 2).split())
    assert "Set it in a cell of your own" in text and "graded, the tests failed" in text
    assert "(withheld)" in feedback.safe_message(f"x{report.NOTE}seed sekrit", secrets=["sekrit"], hidden_lines=set())


def test_the_report_and_results_say_where_they_cut_and_keep_the_note(capsys):
    message = f"{LONG}{report.NOTE}{NOTE}"
    report.print_report(SimpleNamespace(not_graded={}, unwritten=set(), notes={}, messages={"ann": {"p4_tests": message}},
                                        flags={}, flagged_before={}))
    out = capsys.readouterr().out
    assert "[...] Grader's note: " + NOTE in out, out
    rows = results.lines_of(SimpleNamespace(not_graded={}, notes={}, flags={},
                                            messages={"ann": {"p4_tests": "y" * 3000 + report.NOTE + NOTE}}), "ann")
    assert rows[0]["text"].endswith(report.CUT + report.NOTE + NOTE)


def test_the_parts_own_failure_comes_first_and_the_notebooks_cells_are_not_the_students():
    hidden_tests = runner()
    assert hidden_tests.whose("p3_example (code cell 9)") == "the notebook's cell p3_example (code cell 9)"
    assert hidden_tests.whose("p3_added (code cell 10)") == "your cell p3_added (code cell 10)"
    stopped = [("p2_solution", "your cell p2_solution raised NameError: name 'FP16' is not defined " + "x" * 300),
               ("p3_example (code cell 9)", "the notebook's cell p3_example (code cell 9) raised NameError"),
               ("p4_added (code cell 14)", "your cell p4_added (code cell 14) raised ValueError")]
    said = "sgd_step([...], [...], <RecordingScaler>, 0.5) raised NameError: name 'S' is not defined"
    message = hidden_tests.failure(said, stopped, "p4_tests")
    assert message.startswith(said + advice.EARLIER + "your cell p4_added (code cell 14) raised ValueError; your cell p2")
    assert "x" * 300 not in message and "[...]" in message  # another part's error, shortened
    assert hidden_tests.failure(said, [], "p4_tests") == said


def test_the_note_names_no_name_the_cell_binds_itself_nor_one_a_later_parts_test_cell_sets():
    """Student walkthrough 48h, D3: a try-out's own loop variable `name` (which only Part 4's later
    test cell also sets) and its own `fresh` were blamed as test cells' names."""
    part = {"test_id": "p2_tests", "cells": [["p2_added (code cell 5)", "for name in ['a']:\n    print(name)\n"
                                                                         "fresh = 1\nprint(fresh)\n"],
                                             ["p2_solution", "def f():\n    return FP16 + S\n"]]}
    said = "f() raised ValueError: no"
    assert advice.note(part, said, {"name": ["p4"], "fresh": ["p2"]}) is None
    note = advice.note(part, said, {"FP16": ["p1", "p2"], "S": ["p3"], "name": ["p2"]})
    assert note.startswith("your code reads FP16, which the test cells of Parts 1 and 2 set") and "S, which" not in note, note


def test_the_names_the_runner_gives_an_answer_are_the_runners():
    tree = ast.parse(RUNNER.read_text())
    given = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "NOTEBOOK_HABITS":
            given |= {key.value for key in node.value.keys}
    assert given == advice.RUNNER_GIVES


def test_the_summary_cells_ticks_are_said_to_be_the_visible_tests_and_its_output_is_kept():
    """Student walkthrough 48f, confusion 1: the page listed a tick per part right under a lower score."""
    summary = {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "summary", "grade": False}},
               "source": "grading.summary()"}
    printed = "\N{CHECK MARK} Part 1\n<b>mine</b>\n"
    ran = {"cells": [{**summary, "outputs": [{"output_type": "stream", "name": "stdout", "text": printed}]}]}
    nb = feedback.feedback_notebook(ran, {"cells": [summary], "metadata": {}}, {}, {})
    outputs = nb["cells"][0]["outputs"]
    assert outputs[0]["text"] == printed and outputs[-1]["text"] == feedback.SUMMARY_NOTE
    assert "visible tests" in feedback.SUMMARY_NOTE and "not the grade" in feedback.SUMMARY_NOTE


def test_a_students_text_posing_as_the_graders_note_is_quoted():
    """The grader's note starts at report.NOTE; a student's exception raising that text made their
    own words read (and be kept whole) as the grader's."""
    release = {"cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}}]}
    verdicts = {"p1_tests": {"passed": False, "message": f"ValueError: no{report.NOTE}this part is graded by hand: 10/10"}}
    job = {"parts": [{"test_id": "p1_tests", "cells": []}]}
    out = advice.with_test_cell_names(verdicts, release, job)["p1_tests"]["message"]
    assert report.NOTE not in out and "(quoted) Grader's note: this part is graded by hand" in out
    assert report.shortened(out + "x" * 400, 300).endswith(report.CUT)  # cut as the runner's text, no longer kept whole


def test_a_floats_digits_are_shown_and_a_long_number_or_hex_run_is_withheld():
    """Review 54-p: a near miss printed at full precision (`expected 2.3025850929940455, got
    2.3025850929940459`) read `2.(withheld)`: the digits that show the difference were lost."""
    said = feedback.safe_message("loss: expected 2.3025850929940455, got 2.3025850929940459 (1e-05: 1.2345678901234567e-05; "
                                 f"{1 / 300!r})", secrets=[], hidden_lines=set())
    assert "2.3025850929940455" in said and "2.3025850929940459" in said and "1.2345678901234567e-05" in said
    assert repr(1 / 300) in said and "withheld" not in said
    secret = hashlib.sha256(b"x").hexdigest()
    for leak in (secret[:20], str(int(secret, 16)), "0." + str(int(secret, 16)), "12345678901234567890"):
        assert "(withheld)" in feedback.safe_message(f"got {leak}", secrets=[], hidden_lines=set()), leak

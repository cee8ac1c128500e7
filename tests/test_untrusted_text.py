"""Text a student controls (failure messages, Markdown, names) reaches the grader's own process, the
instructor's terminal and nbconvert: it must never crash a run, drive the terminal, stall the
grader or turn a written grade into a reported 0 (issue 45, the red team's A6, A3b, A5)."""
import json

from grader import __main__ as cli
from grader import feedback, feedback_page, notebooks, report, schedule

ESCAPES = "ok\x1b[2K\x1b[1A\x1b]0;PWNED\x07\x1b]52;c;aGk=\x07\x9b31m\u202e\x1b[8m"


def test_a_lone_surrogate_from_a_sandbox_is_read_as_a_replacement_character():
    text = json.dumps({"message": "bad \ud800 value", "pair": "\U0001F600", "escaped": "\\ud800", "low": "\udc00"})
    data = notebooks.json_data(text)
    assert data == {"message": "bad \ufffd value", "pair": "\U0001F600", "escaped": "\\ud800", "low": "\ufffd"}
    nb = notebooks.parse_notebook(json.dumps({"cells": [{"cell_type": "markdown", "source": "x \ud800"}]}).encode())
    json.dumps(nb, ensure_ascii=False).encode()  # nbconvert writes UTF-8: no UnicodeEncodeError


def test_one_students_feedback_page_failing_costs_only_their_page(monkeypatch, tmp_path):
    rendered = []

    def fake_render(course, assignment, excluded, url=None):
        students = {"ann", "bad", "cat"} - set(excluded)
        rendered.append(students)
        return "[GenerateFeedback | ERROR] UnicodeEncodeError: 'utf-8' codec\n" if "bad" in students else None

    for student in ("ann", "bad", "cat"):
        (tmp_path / "autograded" / student / "ex").mkdir(parents=True)
    monkeypatch.setattr(feedback, "render_pages", fake_render)
    failures = feedback.feedback_for(tmp_path, "ex", ["ann", "bad", "cat"])
    assert list(failures) == ["bad"] and "UnicodeEncodeError" in failures["bad"]
    assert {"ann"} in rendered and {"cat"} in rendered


def test_the_report_is_printed_even_when_a_feedback_page_fails(monkeypatch, capsys, tmp_path):
    graded = schedule.Report(scores={"ann": {"p1_tests": 2.0}, "bad": {"p1_tests": 0.0}},
                             messages={"bad": {"p1_tests": "bad \ufffd value"}}, flags={"bad": {"p1": ["walks frames"]}})
    monkeypatch.setattr(schedule, "grade", lambda *args, **kwargs: graded)
    monkeypatch.setattr(feedback, "feedback_for", lambda *args: {"bad": "nbgrader generate_feedback failed: X"})
    monkeypatch.setattr("grader.fabricate.test_points", lambda assignment: {"p1_tests": 2.0})
    cli.grade_course(tmp_path, "ex", 60, True)
    out = capsys.readouterr().out
    assert "bad p1_tests failed: bad \ufffd value" in out and "READ bad p1: its answer walks frames" in out
    assert "NO FEEDBACK PAGE for bad" in out and "ann" in out


def test_the_report_shows_control_characters_and_never_sends_them_to_the_terminal(capsys):
    shown = schedule.Report(not_graded={f"eve{ESCAPES}": ESCAPES}, notes={"eve": ESCAPES},
                            messages={"eve": {"p2_tests": ESCAPES}}, flags={"eve": {"p3": [ESCAPES]}})
    report.print_report(shown)
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\x9b\u202e"), repr(out)
    assert "\\x1b[2K" in out and "READ eve p3" in out and "\\u202e" in out
    assert report.printable("a\tb\nc\ud800") == "a\tb\nc\\ud800"


def test_a_long_or_deeply_nested_formula_stays_as_its_tex():
    deep = "$" + "\\sqrt{" * 3000 + "x" + "}" * 3000 + "$"
    assert feedback_page.readable_maths(deep) == deep  # no RecursionError, nothing lost
    long = "$" + "\\approx" * 40_000 + "$"  # converted, it took seconds (quadratic in the grader's own process)
    assert feedback.inert_markdown(long) == long
    assert feedback_page.readable_maths("$\\sqrt{\\frac{a}{b}} \\approx 2^{-25}$") == "√(a/b) ≈ 2⁻²⁵"


def test_code_spans_are_found_in_one_pass_and_still_keep_maths_as_written():
    """A Markdown cell of backticks (red team 45 A08: 16,000 held the grader 99 s in a regex) is a
    run with no closing run: no span, and the cell comes back as it was."""
    assert feedback_page.code_spans("`" * 20_000) == []
    assert feedback_page.readable_maths("`" * 20_000 + " $\\alpha$") == "`" * 20_000 + " α"
    ragged = "".join("`" * k + "x" for k in range(1, 400))  # runs of every length, none closed
    assert feedback_page.code_spans(ragged) == []
    text = "`$x$` and ``a ` b`` then $\\alpha$ and ` a lone one"
    spans = feedback_page.code_spans(text)
    assert [text[a:b] for a, b in spans] == ["`$x$`", "``a ` b``"]
    assert feedback_page.readable_maths(text) == "`$x$` and ``a ` b`` then α and ` a lone one"


def test_a_feedback_notebook_that_cannot_be_built_is_no_grade_of_zero(monkeypatch):
    monkeypatch.setattr(schedule, "graded_students", lambda *args: {"deep"})
    shown = schedule.Report(scores={"deep": {"p1_tests": 10.0}})
    schedule.unrecorded(shown, None, "ex", {"p1_tests": 10.0}, "deep", RecursionError("too deep"))
    assert "deep" not in shown.not_graded and shown.scores["deep"] == {"p1_tests": 10.0}
    assert "its grade is written, its feedback notebook is not" in shown.notes["deep"]

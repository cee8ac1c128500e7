"""Handing in: a submission folder's single notebook is graded whatever its name (Colab's "Save a
copy" gives `Copy of <assignment>.ipynb`), and the report says which file it took; a notebook whose
cells lost their nbgrader metadata is recovered from the cells' ids, or named in the report."""
import json
import shutil
import warnings
from pathlib import Path

import pytest

from grader import fabricate, feedback, notebooks, runs, schedule
from grader.course import make_course

ROOT = Path(__file__).resolve().parent.parent

NO_SANDBOX = runs.sandbox_problem()
ASSIGNMENT = "ex1_precision_comparison"


def folder_with(tmp_path, *names):
    folder = tmp_path / "submitted" / "s" / "ex"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text(json.dumps({"cells": [], "name": name}))
    return folder


def test_the_assignments_own_name_wins_then_a_single_notebook_whatever_its_name(tmp_path):
    folder_with(tmp_path, "Copy of ex.ipynb", "ex.ipynb", "notes.txt")
    assert notebooks.submitted_name(tmp_path, "s", "ex") == "ex.ipynb"
    assert notebooks.read_submission(tmp_path, "s", "ex")["name"] == "ex.ipynb"
    assert notebooks.renamed_note("ex.ipynb", "ex") is None


@pytest.mark.parametrize("name", ["Copy of ex.ipynb", "ex (1).ipynb", "my work.ipynb"])
def test_a_single_notebook_under_another_name_is_read_and_named(tmp_path, name):
    folder_with(tmp_path, name, "notes.txt", ".hidden.ipynb")
    assert notebooks.submitted_name(tmp_path, "s", "ex") == name
    assert notebooks.read_submission(tmp_path, "s", "ex")["name"] == name
    assert name in notebooks.renamed_note(name, "ex") and "ex.ipynb" in notebooks.renamed_note(name, "ex")


def test_no_notebook_or_several_without_the_assignments_name_are_refused_with_the_reason(tmp_path):
    folder_with(tmp_path, "notes.txt")
    with pytest.raises(ValueError, match="no notebook"):
        notebooks.read_submission(tmp_path, "s", "ex")
    (tmp_path / "submitted" / "s" / "ex" / "a.ipynb").write_text("{}")
    (tmp_path / "submitted" / "s" / "ex" / "Copy of ex.ipynb").write_text("{}")
    with pytest.raises(ValueError, match="2 notebooks .*Copy of ex.ipynb.*hand in one"):
        notebooks.read_submission(tmp_path, "s", "ex")


def release_and_work(tmp_path):
    """The release of ASSIGNMENT, and a notebook with the solution's work in it, in a course folder."""
    release = notebooks.read_notebook(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    (tmp_path / "exercises").symlink_to(ROOT / "exercises")
    fabricate.write_submission(tmp_path, ASSIGNMENT, "s", fabricate.solution_cells(ASSIGNMENT))
    folder = tmp_path / "submitted" / "s" / ASSIGNMENT
    return release, folder, (folder / f"{ASSIGNMENT}.ipynb").read_text()


def test_a_notebook_as_handed_out_is_not_graded_over_one_with_work_in_it(tmp_path):
    """Red team 45g, A08: the work in Colab's `Copy of ...`, the untouched download under the
    exercise's own name beside it: the untouched one was graded, 0 of 10."""
    release, folder, work = release_and_work(tmp_path)
    (folder / f"Copy of {ASSIGNMENT}.ipynb").write_text(work)
    run = json.loads(json.dumps(release))  # as handed out, run: outputs aside, nothing changed
    run["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
    (folder / f"{ASSIGNMENT}.ipynb").write_text(json.dumps(run))
    assert notebooks.as_handed_out(run, release) and not notebooks.as_handed_out(json.loads(work), release)
    graded, others, handed_out = notebooks.submission_files(tmp_path, "s", ASSIGNMENT, release)
    assert (graded, others, handed_out) == (f"Copy of {ASSIGNMENT}.ipynb", [f"{ASSIGNMENT}.ipynb"], {f"{ASSIGNMENT}.ipynb"})
    assert notebooks.read_submission(tmp_path, "s", ASSIGNMENT, release) == json.loads(work)
    note = notebooks.files_note(graded, others, handed_out, ASSIGNMENT)
    assert note == (f"graded 'Copy of {ASSIGNMENT}.ipynb', the notebook with work in it; not graded: "
                    f"'{ASSIGNMENT}.ipynb' (as handed out: no answer changed)")
    assert "as handed out" in feedback.files_cell(graded, others, handed_out)["source"]
    # without the release (or with both as handed out), the exercise's own name wins, as before
    assert notebooks.submitted_name(tmp_path, "s", ASSIGNMENT) == f"{ASSIGNMENT}.ipynb"
    (folder / f"Copy of {ASSIGNMENT}.ipynb").write_text(json.dumps(release))
    assert notebooks.submitted_name(tmp_path, "s", ASSIGNMENT, release) == f"{ASSIGNMENT}.ipynb"


def test_among_notebooks_with_work_the_exercises_own_name_still_wins(tmp_path):
    release, folder, work = release_and_work(tmp_path)
    draft = json.loads(work)
    next(c for c in draft["cells"] if notebooks.grade_id(c) == "p1_solution")["source"] = "x = 1  # a draft\n"
    (folder / f"Copy of {ASSIGNMENT}.ipynb").write_text(json.dumps(draft))
    (folder / f"{ASSIGNMENT} (1).ipynb").write_text(json.dumps(release))
    graded, others, handed_out = notebooks.submission_files(tmp_path, "s", ASSIGNMENT, release)
    assert graded == f"{ASSIGNMENT}.ipynb" and handed_out == {f"{ASSIGNMENT} (1).ipynb"}
    assert notebooks.files_note(graded, others, handed_out, ASSIGNMENT) == (
        f"graded '{ASSIGNMENT}.ipynb'; not graded: 'Copy of {ASSIGNMENT}.ipynb', '{ASSIGNMENT} (1).ipynb' "
        "(as handed out: no answer changed)")
    # two with work, neither named as the exercise: refused as before, the one as handed out left out
    (folder / f"{ASSIGNMENT}.ipynb").rename(folder / "mine.ipynb")
    with pytest.raises(ValueError, match=f"2 notebooks \\(Copy of {ASSIGNMENT}.ipynb, mine.ipynb\\)"):
        notebooks.submitted_name(tmp_path, "s", ASSIGNMENT, release)
    (folder / f"Copy of {ASSIGNMENT}.ipynb").unlink()
    assert notebooks.submitted_name(tmp_path, "s", ASSIGNMENT, release) == "mine.ipynb"


def test_a_renamed_link_is_refused_like_any_link(tmp_path):
    folder = folder_with(tmp_path)
    (tmp_path / "secret.ipynb").write_text(json.dumps({"cells": []}))
    (folder / "Copy of ex.ipynb").symlink_to(tmp_path / "secret.ipynb")
    with pytest.raises(ValueError, match="symbolic link"):
        notebooks.read_submission(tmp_path, "s", "ex")


@pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")
def test_colabs_copy_of_a_notebook_is_graded_and_the_report_says_so(tmp_path):
    course = tmp_path / "course"
    make_course(course, [ASSIGNMENT])
    full = fabricate.solution_cells(ASSIGNMENT)
    for student in ("colab", "two_copies", "with_draft", "beside_the_download"):
        fabricate.write_submission(course, ASSIGNMENT, student, full)
    beside = course / "submitted" / "beside_the_download" / ASSIGNMENT  # red team 45g, A08
    (beside / f"{ASSIGNMENT}.ipynb").rename(beside / f"Copy of {ASSIGNMENT}.ipynb")
    shutil.copy(course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", beside / f"{ASSIGNMENT}.ipynb")
    drafted = course / "submitted" / "with_draft" / ASSIGNMENT
    (drafted / "draft <b>.ipynb").write_text((drafted / f"{ASSIGNMENT}.ipynb").read_text())
    folder = course / "submitted" / "colab" / ASSIGNMENT
    (folder / f"{ASSIGNMENT}.ipynb").rename(folder / f"Copy of {ASSIGNMENT}.ipynb")
    folder = course / "submitted" / "two_copies" / ASSIGNMENT
    (folder / f"{ASSIGNMENT}.ipynb").rename(folder / f"Copy of {ASSIGNMENT}.ipynb")
    (folder / "draft.ipynb").write_text((folder / f"Copy of {ASSIGNMENT}.ipynb").read_text())
    for student, keep_ids in (("stripped", True), ("stripped_and_renumbered", False)):
        fabricate.write_submission(course, ASSIGNMENT, student, full)
        path = course / "submitted" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):  # what an editor that drops unknown metadata leaves
            cell["metadata"].pop("nbgrader", None)
            cell["id"] = cell["id"] if keep_ids else f"{i:08x}"
        path.write_text(json.dumps(nb))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = schedule.grade(course, ASSIGNMENT, execute=False, timeout=60, workers=1)
    # Cells that lost their nbgrader metadata: recovered from their ids, or named, never a silent 0
    assert report.scores.get("stripped") == fabricate.test_points(ASSIGNMENT), (report.not_graded, report.notes)
    assert "recovered from the cells' ids" in report.notes["stripped"]
    assert "nbgrader metadata" in report.not_graded["stripped_and_renumbered"]
    points = fabricate.test_points(ASSIGNMENT)
    assert report.scores["colab"] == points
    assert f"Copy of {ASSIGNMENT}.ipynb" in report.notes["colab"]
    assert "colab" not in report.not_graded
    assert "2 notebooks" in report.not_graded["two_copies"]
    assert sum(report.scores["two_copies"].values()) == 0
    # Issue 48: the one named after the assignment is graded, the other named, in the report and on the page
    assert report.scores["with_draft"] == points and "not graded: 'draft <b>.ipynb'" in report.notes["with_draft"]
    # Red team 45g, A08: the work in `Copy of ...`, the untouched download beside it (0 of 10 before)
    assert report.scores["beside_the_download"] == points, report.messages["beside_the_download"]
    assert report.notes["beside_the_download"] == (
        f"graded 'Copy of {ASSIGNMENT}.ipynb', the notebook with work in it; not graded: "
        f"'{ASSIGNMENT}.ipynb' (as handed out: no answer changed)")

    def first_cell(student):
        return "".join(json.loads((course / "autograded" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text())
                       ["cells"][0]["source"])
    assert f"grades the notebook 'Copy of {ASSIGNMENT}.ipynb'" in first_cell("colab")
    page = first_cell("with_draft")
    assert f"grades the notebook '{ASSIGNMENT}.ipynb'" in page and "Not graded:" in page and "<b>" not in page
    assert f"Not graded: '{ASSIGNMENT}.ipynb' (as handed out: no answer changed)" in first_cell("beside_the_download")


def test_metadata_is_recovered_from_cell_ids_only_where_it_was_lost():
    release = notebooks.read_notebook(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    stripped = json.loads(json.dumps(release))
    for cell in stripped["cells"][:len(stripped["cells"]) // 2]:
        cell["metadata"].pop("nbgrader", None)
    nb, count = notebooks.recovered(stripped, release)
    lost = sum(1 for c in release["cells"][:len(release["cells"]) // 2] if notebooks.grade_id(c))
    assert count == lost > 0
    assert [notebooks.grade_id(c) for c in nb["cells"]] == [notebooks.grade_id(c) for c in release["cells"]]
    assert notebooks.recovered(release, release)[1] == 0


def test_collection_takes_the_notebook_with_work_over_the_one_as_handed_out(tmp_path):
    """Red team 45g, A08, in an LMS download: a Moodle folder with Colab's `Copy of ...` and the
    untouched download; and (red team 45f, A11) a finished notebook beside a leftover with work in it."""
    from grader import collect
    release, folder, work = release_and_work(tmp_path)
    extracted = tmp_path / "downloaded" / ASSIGNMENT / "extracted"
    files = {f"Omar Smith_12346_assignsubmission_file_/Copy of {ASSIGNMENT}.ipynb": work,
             f"Omar Smith_12346_assignsubmission_file_/{ASSIGNMENT}.ipynb": json.dumps(release),
             f"Ann Lee_12347_assignsubmission_file_/{ASSIGNMENT}.ipynb": work,
             f"Ann Lee_12347_assignsubmission_file_/{ASSIGNMENT}_old.ipynb": work.replace("return", "return  # old"),
             f"Bo Wu_12348_assignsubmission_file_/{ASSIGNMENT}.ipynb": json.dumps(release)}
    for name, text in files.items():
        (extracted / name).parent.mkdir(parents=True, exist_ok=True)
        (extracted / name).write_text(text)
    chosen = {student: (path.name, info["handed_out"])
              for student, (path, info) in collect.latest_uploads(extracted, collect.moodle, release=release).items()}
    assert chosen == {"omar_smith_12346": (f"Copy of {ASSIGNMENT}.ipynb", False),
                      "ann_lee_12347": (f"{ASSIGNMENT}.ipynb", False), "bo_wu_12348": (f"{ASSIGNMENT}.ipynb", False)}
    assert collect.latest_uploads(extracted, collect.moodle)["omar_smith_12346"][0].name == f"{ASSIGNMENT}.ipynb"
    assert collect.release_of(tmp_path, ASSIGNMENT) == release
    assert collect.handed_out(extracted / f"Omar Smith_12346_assignsubmission_file_/{ASSIGNMENT}.ipynb", release)


def test_a_notebook_whose_run_all_stopped_before_test_cells_is_told_so_on_its_page():
    """Student walkthrough 48h, D1: a raising try-out stopped Run All, so Part 4's test cell never
    ran in the student's notebook (no tick), yet the part got 2/2 (grading runs each part on its
    own), and the page said nothing of it."""
    release = notebooks.read_notebook(ROOT / "exercises" / "ex2_loss_scaling" / "ex2_loss_scaling.ipynb")
    tests = {notebooks.grade_id(c) for c in release["cells"] if (notebooks.grade_id(c) or "").endswith("_tests")}
    cells = json.loads(json.dumps(release["cells"]))
    code = [c for c in cells if c["cell_type"] == "code"]
    last_test = max(n for n, c in enumerate(code) if notebooks.grade_id(c) in tests)
    for count, cell in enumerate(code[:last_test - 1], 1):  # Run All, up to a try-out that raises
        cell["execution_count"], cell["outputs"] = count, []
    code[last_test - 2]["outputs"] = [{"output_type": "error", "ename": "ValueError", "evalue": "zip() argument 2 is "
                                       "shorter than argument 1", "traceback": []}]
    notebook = {**release, "cells": cells}
    assert notebooks.stopped_at(notebook, tests) == f"code cell {last_test - 1} (ValueError)"
    page = feedback.feedback_notebook(notebook, release, {t: 1.0 for t in tests}, {},
                                      stopped=notebooks.stopped_at(notebook, tests))
    assert any("stopped at code cell" in "".join(c["source"]) and "Run All" in "".join(c["source"])
               for c in page["cells"] if c["cell_type"] == "markdown")
    # the control: the error was not the last cell run (a later cell ran after it), or no test cell follows
    code[last_test]["execution_count"] = 10_000
    assert notebooks.stopped_at(notebook, tests) is None
    code[last_test]["execution_count"] = None
    assert notebooks.stopped_at(notebook, set()) is None
    code[last_test - 2]["outputs"] = []
    assert notebooks.stopped_at(notebook, tests) is None
    code[last_test - 2]["outputs"] = 5  # a broken submission's outputs: no error, no crash
    assert notebooks.stopped_at(notebook, tests) is None

"""Collecting into a course that already holds submissions, the ids and names a collection keeps,
and the class's results read back from the gradebook (instructor walkthrough 47b: C2, C3, C4, C6)."""
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
import warnings
from pathlib import Path

import pytest

from grader import collect, fabricate, gradebook, notebooks, schedule
from grader.__main__ import main
from tests import postgres
from tests.test_instructor import ASSIGNMENT, ROOT, collected, fresh_course, lms_zip, registered_course  # noqa: F401

A = ASSIGNMENT


def run_collect(course: Path, download: Path, lms: str) -> str:
    result = subprocess.run([sys.executable, "-m", "grader", "collect", A, "--lms", lms, "--zip", str(download),
                             "--course", str(course)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def remembered(course: Path) -> dict:
    return json.loads((course / "downloaded" / A / collect.LMS_FILE).read_text(encoding="utf-8"))["students"]


def test_a_collect_names_the_students_its_download_does_not_hold_and_what_to_do(tmp_path):
    """C2: a later download without a student (withdrawn; or another LMS's class) left their
    submission in submitted/, silently, to be graded and exported with the others."""
    course = fresh_course(tmp_path / "course")
    run_collect(course, lms_zip(tmp_path / "first.zip", {f"doejane_123456_7890123_{A}.ipynb": "jane",
                                                         f"smithomar_223344_7890456_{A}.ipynb": "omar",
                                                         f"leebo_4455_7777_{A}.ipynb": "bo"}), "canvas")
    second = lms_zip(tmp_path / "second.zip", {f"doejane_123456_7890000_{A}.ipynb": "jane's earlier",
                                               f"doejane_123456_7890999_{A}.ipynb": "jane again",
                                               "leebo_4455_7778_work.zip": {f"{A}.ipynb": "bo, zipped"}})
    said = run_collect(course, second, "canvas")
    assert collected(course) == {"doejane_123456": "jane again", "smithomar_223344": "omar", "leebo_4455": "bo"}
    assert "NOT COLLECTED leebo_4455: no notebook of theirs in this download was collected" in said  # his earlier one stays
    assert ("NOT IN THIS DOWNLOAD: 1 student with a submission of ex2_loss_scaling in submitted/ that this download "
            "does not hold") in said and said.split("NOT IN THIS DOWNLOAD")[1].split("\n")[0].endswith(": smithomar_223344")
    assert f"mv submitted/<student>/{A} <elsewhere>" in said and '"Starting over"' in said
    assert "3 submissions of" in said and "1 file skipped" in said and "1 files" not in said  # plurals
    # moved out as the line says, then collected again: forgotten, for export --lms and pack-feedback too
    shutil.move(course / "submitted" / "smithomar_223344", tmp_path / "set-aside")
    said = run_collect(course, second, "canvas")
    assert "NOT IN THIS DOWNLOAD" not in said and "2 submissions of" in said
    assert set(remembered(course)) == {"doejane_123456", "leebo_4455"}


NAMES = {"Ana García": "ana_garcía_5501004", "Иван Петров": "иван_петров_5501007",
         "प्रिया शर्मा": "प्रिया_शर्मा_5501008", "王小明": "王小明_5501010",
         "Bo, Zoë [x]*": "bo_zoë_x_5501009", "Jean-Luc O'Neil": "jean-luc_o_neil_5501011"}


def test_moodle_ids_keep_a_names_letters_in_any_script_alike_on_every_collect(tmp_path):
    """C3: `Ana García` was `ana_garc_a_5501004`, and a name in another script only its number;
    each id holds the name's letters (lower-cased), composed (NFC) whatever the download's form,
    no character nbgrader reads as a list or a pattern, and nbgrader's gradebook takes it."""
    course = fresh_course(tmp_path / "course")
    numbers = {name: int(sid.rsplit("_", 1)[1]) for name, sid in NAMES.items()}
    composed = {f"{name}_{numbers[name]}_assignsubmission_file_/{A}.ipynb": name for name in NAMES}
    run_collect(course, lms_zip(tmp_path / "composed.zip", composed), "moodle")
    assert collected(course) == {sid: name for name, sid in NAMES.items()}
    decomposed = {unicodedata.normalize("NFD", path): f"{name} again" for path, name in composed.items()}
    said = run_collect(course, lms_zip(tmp_path / "decomposed.zip", decomposed), "moodle")  # as macOS writes names
    assert collected(course) == {sid: f"{name} again" for name, sid in NAMES.items()} and "NOT IN THIS" not in said
    assert not any(c in sid for sid in NAMES.values() for c in " ,*?[]./\\")
    urls = {"sqlite": None}
    with contextlib.ExitStack() as stack:
        if postgres.problem() is None:
            urls["postgresql"] = stack.enter_context(postgres.Server()).database("gradebook")
        for url in urls.values():
            assert gradebook.prepare(course, A, url) == sorted(NAMES.values())
            from nbgrader.api import Gradebook
            with Gradebook(gradebook.db_url(course, url)) as book, warnings.catch_warnings():
                warnings.filterwarnings("ignore")
                assert sorted(s.id for s in book.students) == sorted(NAMES.values())
                gradebook.write_grades(book, A, NAMES["प्रिया शर्मा"], dict(fabricate.test_points(A)))
            assert set(gradebook.scores(course, A, gradebook.db_url(course, url))) == {NAMES["प्रिया शर्मा"]}


def graded(course: Path, students: dict, url: str | None = None) -> None:
    """Write each student's grade as a grading run does (gradebook.record, in a session of its own,
    as each shard's): {student: (passed parts, failure message, problem or None[, review flags])}."""
    from nbgrader.api import Gradebook
    points = fabricate.test_points(A)
    release = notebooks.read_notebook(course / "exercises" / A / f"{A}.ipynb")
    for student, (passed, message, problem, *flags) in students.items():
        report = schedule.Report()
        verdicts = {} if problem else {t: {"passed": k < passed, "message": "" if k < passed else message}
                                       for k, t in enumerate(points)}
        ran = notebooks.read_submission(course, student, A, release)
        with Gradebook(gradebook.db_url(course, url)) as book, warnings.catch_warnings():
            warnings.filterwarnings("ignore")
            gradebook.record(book, course, A, student, (verdicts, ran, problem, None, (flags or [None])[0]), points, release, report,
                             secrets=["s"], hidden_lines=set())


def test_the_report_and_the_feedback_page_name_the_file_the_student_uploaded(registered_course, tmp_path):
    """C4: Colab's `Copy of ex2_loss_scaling.ipynb`, uploaded to Canvas, was collected as
    `ex2_loss_scaling.ipynb`, and the student's page named that file, which they never uploaded."""
    course = Path(shutil.copytree(registered_course, tmp_path / "course"))
    run_collect(course, lms_zip(tmp_path / "canvas.zip", {f"doejane_123456_7890123_{A}-1.ipynb": "jane",
                                                          f"smithomar_223344_7890456_Copy of {A}.ipynb": "omar"}),
                "canvas")
    assert remembered(course)["smithomar_223344"]["uploaded"] == f"Copy of {A}.ipynb"
    release = notebooks.read_notebook(course / "exercises" / A / f"{A}.ipynb")

    def note(student):
        files = notebooks.submission_files(course, student, A, release)
        return notebooks.files_note(*files, A, notebooks.uploaded_as(course, student, A, files[0]))

    assert note("smithomar_223344") == f"graded 'Copy of {A}.ipynb', as uploaded to the LMS (collected as {A}.ipynb)"
    assert note("doejane_123456") is None  # `-1` is Canvas's: she uploaded it under the exercise's name
    from grader.results import create_table
    create_table(gradebook.db_url(course))
    from nbgrader.api import Gradebook
    with Gradebook(gradebook.db_url(course)) as book:
        gradebook.create_graded_table(book)  # as `grade` makes it
    graded(course, {"smithomar_223344": (1, "wrong", None), "doejane_123456": (9, "", None)})
    page = json.loads((course / "autograded" / "smithomar_223344" / A / f"{A}.ipynb").read_text())
    assert "".join(page["cells"][0]["source"]).startswith(f"This page grades the notebook 'Copy of {A}.ipynb' of")
    page = json.loads((course / "autograded" / "doejane_123456" / A / f"{A}.ipynb").read_text())
    assert "".join(page["cells"][0]["source"]).startswith(f"This page grades the notebook '{A}.ipynb' of")
    # a notebook put there by hand since is not the file uploaded: its own name, then
    (course / "submitted" / "smithomar_223344" / A / f"{A}.ipynb").write_text(
        json.dumps(notebooks.read_notebook(course / "exercises" / A / f"{A}.ipynb")))
    assert note("smithomar_223344") is None
    from grader import feedback  # the name is the student's text: shown, never rendered
    cell = feedback.files_cell(f"{A}.ipynb", [], set(), "Copy of <img src=x onerror=alert(1)> [a](javascript:1).ipynb")
    assert "<img" not in cell["source"] and "](javascript:" not in cell["source"]
    assert collect.moodle(Path(f"Bo Lee_12347_assignsubmission_file_/Copy of {A} (1).ipynb"))["uploaded"] == \
        f"Copy of {A} (1).ipynb"
    assert collect.moodle(Path(f"Bo Lee_12347_assignsubmission_file_{A} (1).ipynb"))["uploaded"] == f"{A} (1).ipynb"


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_results_prints_the_whole_classs_table_and_report_from_the_gradebook(registered_course, tmp_path, capsys,
                                                                             database):
    """C6: after grading in shards, each shard had printed its own students' table and failure
    messages only; `results` prints the class's from the gradebook, whichever machine graded whom."""
    if database == "postgresql" and postgres.problem():
        pytest.skip(postgres.problem())
    course = Path(shutil.copytree(registered_course, tmp_path / "course"))
    run_collect(course, lms_zip(tmp_path / "canvas.zip", {f"doejane_123456_7890123_{A}.ipynb": "jane",
                                                          f"smithomar_223344_7890456_{A}.ipynb": "omar",
                                                          f"leebo_late_4455_7777_{A}.ipynb": "bo",
                                                          f"kimann_5566_8888_{A}.ipynb": "ann"}), "canvas")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(postgres.Server()).database("gradebook") if database == "postgresql" else None
        gradebook.prepare(course, A, url)
        graded(course, {"doejane_123456": (99, "", None)}, url)                  # shard 1
        graded(course, {"smithomar_223344": (1, "p2: expected 3.0, got \x1b[2J 4.0 \x00\ud800", None,  # shard 2
                                             {"p1": ["reads the call stack"]}),
                        "leebo_4455": (0, "", "the notebook ran out of time")}, url)
        main(["results", A, "--course", str(course), *(["--db-url", url] if url else [])])
    said = capsys.readouterr().out
    points = fabricate.test_points(A)
    rows = {line.split()[0]: line.split()[1:] for line in said.splitlines()
            if not line.startswith(" ") and line.split() and line.split()[0] in ("doejane_123456", "smithomar_223344", "leebo_4455")}
    assert {s: float(r[-1]) for s, r in rows.items()} == {"doejane_123456": sum(points.values()),
                                                         "smithomar_223344": list(points.values())[0], "leebo_4455": 0}, said
    second = list(points)[1]
    # shown, never obeyed; a NUL (which PostgreSQL refuses in text: red team 45j, A05, A06) and a lone surrogate stored
    assert f"  smithomar_223344 {second} failed: p2: expected 3.0, got \\x1b[2J 4.0 \\x00?" in said
    assert "NOT GRADED leebo_4455: the notebook ran out of time (recorded as 0)" in said
    assert "  READ smithomar_223344 p1: its answer reads the call stack" in said  # the flags kept with the grade
    assert "NOT GRADED YET: 1 student with a submission in submitted/ and no grade: kimann_5566" in said
    assert not any(line.startswith("  doejane_123456") for line in said.splitlines())  # jane: a row, no failure line
    assert "3 students graded in" in said
    assert f"LATE: leebo_4455 handed in {A} late" in said and said.count("LATE:") == 1  # collect's line, again


def test_counts_of_one_read_in_the_singular():
    """Walkthrough 47b, wording: "1 files skipped", "1 students graded", "1 students' secret inputs"."""
    from grader.report import plural
    assert collect.counted("6 files collected, 1 files skipped") == "6 files collected, 1 file skipped"
    assert collect.counted("1 files collected, 0 files skipped") == "1 file collected, 0 files skipped"
    report = schedule.Report(seconds={"jane": 10.0}, wall_seconds=10.0, workers=1)
    assert schedule.closing_line(A, report).startswith(f"{A}: 1 student graded in 10 s")
    report.setup_seconds = 57.2  # walkthrough 47c: the command took a minute longer than the line said
    assert schedule.closing_line(A, report).startswith(f"{A}: 1 student graded in 10 s (after 57 s of set-up")
    assert plural(1, "student's", "students'") == "1 student's" and plural(2, "student's", "students'") == "2 students'"


def test_one_students_upload_is_read_up_to_a_number_of_notebooks_and_bytes(tmp_path, monkeypatch):
    """Red team 45i, A08: a 1 MB download of 20 compressible notebooks just under the size limit,
    all in one student's Moodle folder, wrote 2 GB (each file twice), linearly in their number."""
    download = lms_zip(tmp_path / "moodle.zip", {
        **{f"Mallory Evil_111_assignsubmission_file_/copy{i:02d}.ipynb": f"m{i}" for i in range(15)},
        f"Bob Smith_222_assignsubmission_file_/{A}.ipynb": "bob"})
    skipped = collect.unpack(download, tmp_path / "archive", collect.moodle)
    too_many = [name for name, why in skipped.items() if "one notebook too many" in why]
    assert too_many == [f"Mallory Evil_111_assignsubmission_file_/copy{i:02d}.ipynb"
                        for i in range(collect.NOTEBOOKS_PER_STUDENT, 15)]
    assert len(list((tmp_path / "archive").rglob("*.ipynb"))) == collect.NOTEBOOKS_PER_STUDENT + 1  # bob's read
    size = (tmp_path / "archive" / "Bob Smith_222_assignsubmission_file_" / f"{A}.ipynb").stat().st_size
    monkeypatch.setattr(collect, "BYTES_PER_STUDENT", 3 * size)  # and by bytes: the first three of hers
    skipped = collect.unpack(download, tmp_path / "again", collect.moodle)
    assert len([name for name, why in skipped.items() if "one notebook too many" in why]) == 12
    assert (tmp_path / "again" / "Bob Smith_222_assignsubmission_file_" / f"{A}.ipynb").exists()


def test_lines_about_files_that_read_as_no_students_are_capped_and_a_classmates_note_stays_in_view(tmp_path):
    """Red team 45i, A07: 3,000 notebooks whose names read as more than one student's upload
    printed 3,000 lines (the per-student cap did not apply: they are no one's), and a classmate's
    "check it by hand" note scrolled out of sight."""
    course = fresh_course(tmp_path / "course")
    names = {f"Mallory Evil_111_assignsubmission_file_/x_1_assignsubmission_file_y_2_assignsubmission_file_{i}.ipynb":
             f"m{i}" for i in range(40)}
    names.update({f"Bob Smith_222_assignsubmission_file_/{A}.ipynb": "bob",
                  f"Bob Smith_222_assignsubmission_file_/{A}_old.ipynb": "bob old"})
    said = run_collect(course, lms_zip(tmp_path / "moodle.zip", names), "moodle")
    unowned = [line for line in said.splitlines() if line.startswith("  skipped Mallory Evil_111")]
    assert len(unowned) == collect.NOTES_UNOWNED, said
    more = re.search(rf"{collect.UNOWNED}: (\d+) more files skipped, not listed", said)
    assert more and int(more[1]) >= 40 - collect.NOTES_UNOWNED, said  # (and nbgrader's lines on the refused)
    assert f"bob_smith_222: skipped {A}_old.ipynb: the same submission holds {A}.ipynb" in said


def test_a_student_canvas_renamed_between_downloads_is_named_and_never_exported_twice(registered_course, tmp_path):
    """Red team 45i, A05: Canvas user 123456, `smithjane` in the first download and `doejane` in
    the second, became two students; `export --lms canvas` wrote two rows with ID 123456 (the stale
    grade among them), silently."""
    from grader import lms
    course = Path(shutil.copytree(registered_course, tmp_path / "course"))
    run_collect(course, lms_zip(tmp_path / "one.zip", {f"smithjane_123456_7890123_{A}.ipynb": "old"}), "canvas")
    said = run_collect(course, lms_zip(tmp_path / "two.zip", {f"doejane_123456_7890999_{A}.ipynb": "new"}), "canvas")
    assert "SAME USER: canvas user 123456 is 2 students here, doejane_123456, smithjane_123456" in said
    gradebook.prepare(course, A)
    graded(course, {"doejane_123456": (99, "", None), "smithjane_123456": (0, "", None)})
    for step in (lambda: lms.export_grades(course, A, "canvas", tmp_path / "grades.csv"),
                 lambda: lms.pack_feedback(course, A, "canvas", tmp_path / "upload")):
        with pytest.raises(ValueError, match="canvas user 123456 is 2 students here: doejane_123456, smithjane_123456"):
            step()
    assert not (tmp_path / "grades.csv").exists()
    shutil.move(course / "submitted" / "smithjane_123456", tmp_path / "stale")  # as the message says
    run_collect(course, lms_zip(tmp_path / "two.zip", {f"doejane_123456_7890999_{A}.ipynb": "new"}), "canvas")
    assert lms.export_grades(course, A, "canvas", tmp_path / "grades.csv") == {"doejane_123456": sum(fabricate.test_points(A).values())}


def test_a_canvas_download_with_anonymous_grading_says_why_no_one_was_collected(tmp_path):
    """Red team 45i, A10: with anonymous grading on, Canvas names files `anon_<id>_...`: nobody was
    collected, and the lines said only "Not a CanvasCollector submission"."""
    course = fresh_course(tmp_path / "course")
    said = run_collect(course, lms_zip(tmp_path / "anon.zip", {f"anon_x7k2q_7890123_{A}.ipynb": "a",
                                                               f"LATE_anon_p9w3z_7890456_{A}.ipynb": "b"}), "canvas")
    assert "ANONYMOUS: this download's names carry no student" in said
    plain = run_collect(course, lms_zip(tmp_path / "named.zip", {f"doejane_123456_7890123_{A}.ipynb": "jane"}), "canvas")
    assert "ANONYMOUS" not in plain


def test_a_grade_whose_record_fails_is_rolled_back_not_committed_with_the_next_students(registered_course, tmp_path,
                                                                                       monkeypatch):
    """Red team 45j, A06: PostgreSQL refused one student's report line; the grader neither caught
    it nor rolled back, and the next student's commit wrote her grades without her report lines
    or the record of her flags."""
    from grader import results
    course = Path(shutil.copytree(registered_course, tmp_path / "course"))
    run_collect(course, lms_zip(tmp_path / "canvas.zip", {f"doejane_123456_7890123_{A}.ipynb": "jane",
                                                          f"smithomar_223344_7890456_{A}.ipynb": "omar"}), "canvas")
    gradebook.prepare(course, A)
    real = results.write_notes

    def refused_for_jane(book, assignment, student, report):
        if student == "doejane_123456":
            raise ValueError("the database refused a line")  # as psycopg's DataError on a NUL
        real(book, assignment, student, report)
    monkeypatch.setattr(results, "write_notes", refused_for_jane)
    points = fabricate.test_points(A)
    release = notebooks.read_notebook(course / "exercises" / A / f"{A}.ipynb")
    from nbgrader.api import Gradebook
    with Gradebook(gradebook.db_url(course)) as book, warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        for student in ("doejane_123456", "smithomar_223344"):  # one session, as a grading run's
            verdicts = {t: {"passed": True, "message": ""} for t in points}
            ran = notebooks.read_submission(course, student, A, release)
            try:
                gradebook.record(book, course, A, student, (verdicts, ran, None, None, {"p1": ["reads the call stack"]}),
                                 points, release, schedule.Report(), secrets=["s"], hidden_lines=set())
            except ValueError:
                assert student == "doejane_123456"
        assert gradebook.graded_students(book, A, points) == {"smithomar_223344"}  # jane: graded again next run
        assert set(gradebook.graded_records(book, A)) == {"smithomar_223344"}


def test_a_canvas_name_in_decomposed_unicode_is_the_same_student_and_a_folder_download_is_read(tmp_path):
    """Red team 45j, A01: `mu\\u0308llerjürgen` (a combining mark, as macOS writes names) did not
    match Canvas's name pattern: never collected, a re-submission ignored. A02: a download given as
    a folder (`--zip FOLDER`, as the help says) crashed collection (files read as text)."""
    from grader import review_flags
    course = fresh_course(tmp_path / "course")
    composed = f"müllerjürgen_445566_7890123_{A}.ipynb"
    run_collect(course, lms_zip(tmp_path / "one.zip", {composed: "first"}), "canvas")
    folder = tmp_path / "folder"
    with __import__("zipfile").ZipFile(lms_zip(tmp_path / "two.zip", {
            unicodedata.normalize("NFD", composed.replace("7890123", "7890999")): "again"})) as z:
        z.extractall(folder)
    said = run_collect(course, folder, "canvas")
    assert collected(course) == {"müllerjürgen_445566": "again"}, said
    assert "NOT IN THIS DOWNLOAD" not in said
    long = review_flags.module_flags("a" * 2100)  # a student's module name, shortened in the flag
    assert len(next(iter(long))) < 200


def test_a_grade_that_is_not_current_is_never_handed_back_as_if_it_were(registered_course, tmp_path, capsys):
    """Red team 45k, A02, A06: a re-submission collected after grading; `results`, `export --lms`
    and `pack-feedback --lms` gave the earlier submission's grade and page, silently. A11: a student
    whose rows a stopped run left half-written was shown and exported as 0."""
    from nbgrader.api import Gradebook
    from grader import lms
    course = Path(shutil.copytree(registered_course, tmp_path / "course"))
    run_collect(course, lms_zip(tmp_path / "one.zip", {f"doejane_123456_7890123_{A}.ipynb": "blank",
                                                       f"kimann_5566_8888_{A}.ipynb": "ann"}), "canvas")
    gradebook.prepare(course, A)
    graded(course, {"doejane_123456": (0, "not done", None), "kimann_5566": (99, "", None)})
    feedback_pages = tmp_path / "upload"
    assert lms.export_grades(course, A, "canvas", tmp_path / "before.csv")["doejane_123456"] == 0  # current: fine
    run_collect(course, lms_zip(tmp_path / "two.zip", {f"doejane_123456_7890999_{A}.ipynb": "finished",
                                                       f"kimann_5566_8888_{A}.ipynb": "ann"}), "canvas")
    with Gradebook(gradebook.db_url(course)) as book, warnings.catch_warnings():  # a stopped run's half
        warnings.filterwarnings("ignore")
        for grade in book.find_submission_notebook(A, A, "kimann_5566").grades:
            grade.auto_score = None
        book.db.commit()
    main(["results", A, "--course", str(course)])
    said = capsys.readouterr().out
    assert "NOT CURRENT doejane_123456: handed in again since graded" in said
    assert "NOT GRADED YET: 1 student with a submission in submitted/ and no grade: kimann_5566" in said
    for step in (lambda: lms.export_grades(course, A, "canvas", tmp_path / "grades.csv"),
                 lambda: lms.pack_feedback(course, A, "canvas", feedback_pages)):
        with pytest.raises(ValueError, match=r"not current \(doejane_123456: handed in again since graded.*"
                                             r"kimann_5566: a part has no grade written"):
            step()
    assert not (tmp_path / "grades.csv").exists()


def test_canvas_names_with_marks_anonymous_names_and_zips_without_the_utf8_flag_are_read_right(tmp_path):
    """Red team 45k: A04, names whose script writes marks as characters of their own (Devanagari's
    vowel signs, Arabic's shadda) never collected; A01, an anonymous download whose file name began
    with digits read the file id as a user id, silently; A03, a zip without the UTF-8 flag gave
    `m├╝ller`; A10, late hand-ins' LATE lines capped with the skipped files."""
    import zipfile
    course = fresh_course(tmp_path / "course")
    names = {f"अमितशर्मा_late_445566_7890123_{A}.ipynb": "amit", f"محمّد_7788_7890124_{A}.ipynb": "muhammad",
             f"müllerjürgen_5566_7890125_{A}.ipynb": "jurgen"}
    names.update({f"late{i:02d}_late_{9000 + i}_{8000 + i}_{A}.ipynb": f"l{i}" for i in range(12)})
    lms_zip(tmp_path / "flagged.zip", names)
    class Unflagged(zipfile.ZipInfo):  # the name's UTF-8 bytes, without the flag (as some zippers write)
        def _encodeFilenameFlags(self):
            return self.filename.encode("cp437"), self.flag_bits
    with zipfile.ZipFile(tmp_path / "flagged.zip") as flagged, zipfile.ZipFile(tmp_path / "plain.zip", "w") as plain:
        for info in flagged.infolist():
            plain.writestr(Unflagged(info.filename.encode("utf-8").decode("cp437"), info.date_time), flagged.read(info))
    with zipfile.ZipFile(tmp_path / "plain.zip") as plain:
        assert any("├" in i.filename for i in plain.infolist())  # as zipfile reads it
    said = run_collect(course, tmp_path / "plain.zip", "canvas")
    assert {s: m for s, m in collected(course).items() if not s.startswith("late")} == {
        "अमितशर्मा_445566": "amit", "محمّد_7788": "muhammad", "müllerjürgen_5566": "jurgen"}, said
    assert said.count("LATE: ") == 13, said  # one line each, never capped
    anonymous = fresh_course(tmp_path / "anonymous")
    said = run_collect(anonymous, lms_zip(tmp_path / "anon.zip", {f"anon_x7k2q_7890123_1_{A}.ipynb": "a",
                                                                  f"anon_12345_7890124_{A}.ipynb": "b"}), "canvas")
    assert "ANONYMOUS" in said and collected(anonymous) == {}


def test_a_canvas_id_never_starts_with_a_dash_or_a_dot():
    """Issue 46: ids are sanitised, no leading `-` (an option to a command) or `.` (a hidden
    folder); Canvas's own names hold neither, so only a hand-made download has one."""
    from grader import collect
    ids = {name: collect.canvas(Path(f"{name}_4455_7890123_{A}.ipynb"))["student_id"]
           for name in ("--help", ".hidden", "-.-", "doe-jane")}
    assert ids == {"--help": "help_4455", ".hidden": "hidden_4455", "-.-": "_4455", "doe-jane": "doe-jane_4455"}


def test_a_moodle_folder_as_moodle_4_1_on_names_it_is_collected():
    """Review 52g (wrong): Moodle 4.1 on names a student's folder `Jane Doe_12345_assignsubmission_file`,
    with no `_` after the plugin (mod/assign/classes/downloader.php): collect took no one."""
    from grader import collect
    for folder in ("Jane Doe_12345_assignsubmission_file", "Jane Doe_12345_assignsubmission_file_"):
        info = collect.moodle(Path(f"{folder}/{A}.ipynb"))
        assert info["student_id"] == "jane_doe_12345" and info["uploaded"] == f"{A}.ipynb", (folder, info)
    refused = collect.moodle(Path(f"Mal_777_assignsubmission_file_ x_12345_assignsubmission_file/{A}.ipynb"))
    assert refused["student_id"] is None and "ambiguous" in refused


def test_a_student_named_with_another_shard_is_said_to_be_there(tmp_path, capsys, monkeypatch):
    """Red team 45k, A05: the guide's regrade command (`--student ID --regrade`) with `--shard K/N`
    graded no one, saying only "0 students graded"."""
    from tests.test_large_class import ASSIGNMENT as LA, StandIn, course_of, graded_by_stand_ins
    course = course_of(tmp_path / "course", {"ada": {}, "bob": {}, "cy": {}})
    release = notebooks.read_notebook(course / "exercises" / LA / f"{LA}.ipynb")
    other = next(k for k in (1, 2) if not schedule.in_shard("ada", (k, 2)))
    capsys.readouterr()
    report = graded_by_stand_ins(course, monkeypatch)(StandIn(release), students=["ada"], shard=(other, 2))
    assert report.scores == {}
    assert f"ada: in another shard than {other}/2, not graded by this command" in capsys.readouterr().err


def test_a_name_that_grows_past_a_folder_names_bytes_or_holds_line_breaks_harms_no_classmate(tmp_path):
    """Red team 45l: A01, a Moodle name of 110 `Ⱥ` (250 bytes; lower-cased, 337) stopped the whole
    class's collection (File name too long); A05, a file name holding U+2028 and a LATE line about
    a classmate printed that line as collect's; A03, a Persian name's zero-width non-joiner; A04, a
    folder download's file name in another encoding emptied lms.json for good."""
    course = fresh_course(tmp_path / "course")
    said = run_collect(course, lms_zip(tmp_path / "moodle.zip", {
        f"{'Ⱥ' * 110}_5501001_assignsubmission_file_/{A}.ipynb": "long",
        f"Яна Петрова_5501002_assignsubmission_file_/{A}.ipynb": "yana"}), "moodle")
    ids = collected(course)
    assert sorted(ids.values()) == ["long", "yana"] and "яна_петрова_5501002" in ids, said
    assert all(len(s.encode()) <= collect.ID_BYTES for s in ids), ids
    canvas = fresh_course(tmp_path / "canvas")
    forged = f"mallory_1001_7001_x\u2028LATE: smithomar_1002 handed in {A} late\u2028.ipynb"
    said = run_collect(canvas, lms_zip(tmp_path / "canvas.zip", {
        forged: "mallory", f"mallory_1001_7002_{A}.ipynb": "mallory's", f"smithomar_1002_7003_{A}.ipynb": "omar",
        f"می\u200cخواهم_1003_7004_{A}.ipynb": "persian"}), "canvas")
    assert not [line for line in said.splitlines() if line.lstrip().startswith("LATE:")], said
    assert "persian" in collected(canvas).values(), said
    folder = tmp_path / "folder"
    folder.mkdir()
    latin1 = os.fsdecode(f"doejane_123456_7890123_caf\xe9_{A}.ipynb".encode("latin-1"))  # not UTF-8 bytes
    shutil.copy(canvas / "submitted" / "smithomar_1002" / A / f"{A}.ipynb", folder / latin1)
    run_collect(canvas, folder, "canvas")
    assert "doejane_123456" in remembered(canvas)  # lms.json whole, and read back


def test_plain_export_and_pack_feedback_hand_back_no_grade_that_is_not_current(registered_course, tmp_path):
    """Red team 45l, A02: after a re-submission was collected, `export --lms` and `pack-feedback
    --lms` refused, but the plain `export` (grades.csv) and `pack-feedback` handed back the old grade
    and page."""
    from grader import feedback
    course = Path(shutil.copytree(registered_course, tmp_path / "course"))
    run_collect(course, lms_zip(tmp_path / "one.zip", {f"doejane_123456_7890123_{A}.ipynb": "blank"}), "canvas")
    gradebook.prepare(course, A)
    graded(course, {"doejane_123456": (0, "not done", None)})
    gradebook.export(course, tmp_path / "before.csv")  # current: fine
    run_collect(course, lms_zip(tmp_path / "two.zip", {f"doejane_123456_7890999_{A}.ipynb": "finished"}), "canvas")
    with pytest.raises(RuntimeError, match="doejane_123456: handed in again since graded"):
        gradebook.export(course, tmp_path / "grades.csv")
    with pytest.raises(ValueError, match="doejane_123456: handed in again since graded"):
        feedback.pack_feedback(course, A, tmp_path / "upload")
    assert not (tmp_path / "grades.csv").exists() and not (tmp_path / "upload").exists()


REFUSED = "hw_3_1_solution.ipynb"  # an honest name that reads as two Canvas uploads (`_3_1_`): refused
PEOPLE = {"smithann": "smithann_2001", "शर्माराज": "शर्माराज_2002", "علی\u200cرضا": "علی\u200cرضا_2003",
          unicodedata.normalize("NFD", "müllerjürgen"): "müllerjürgen_2004", "-dash": "dash_2005", ".dot": "dot_2006"}


def test_a_refused_notebooks_student_is_the_id_collect_gives_them(tmp_path):
    """Red team 16c, A02, A02b: the owner of a refused notebook was read from the raw name, not as a
    collected one's student is (NFC, marks read as letters, no leading `-` or `.`): a Devanagari,
    Persian or decomposed name got no NOT COLLECTED line, and `-dash` or `.dot` one for an id that
    is no one's (a hidden folder)."""
    archive = tmp_path / "archive"
    archive.mkdir()
    for person, student in PEOPLE.items():
        user = student.rsplit("_", 1)[1]
        (archive / f"{person}_{user}_5001_{REFUSED}").write_text("{}")
        assert collect.canvas(Path(f"{person}_{user}_5000_{A}.ipynb"))["student_id"] == student
    owners = collect.refused_owners(archive, collect.canvas)
    assert sorted(owners) == sorted(PEOPLE.values()), owners


def test_a_flood_of_refused_names_never_costs_a_classmate_their_not_collected_line(tmp_path):
    """Red team 16c, A01: 21 of Mallory's notebooks whose names read as two uploads used up the
    budget that every refused name shared (no one's), so Zoe's only notebook (refused too) was never
    read, and her NOT COLLECTED line never printed."""
    download = lms_zip(tmp_path / "canvas.zip", {
        f"aaronmal_1001_3000_{A}.ipynb": "mallory",
        **{f"aaronmal_1001_{3001 + k}_x_1_{k}_y.ipynb": f"m{k}" for k in range(21)},
        f"bobbob_1002_4000_{A}.ipynb": "bob", "youngzoe_1009_5009_lab_2_1_answers.ipynb": "zoe"})
    skipped = collect.unpack(download, tmp_path / "archive", collect.canvas)
    assert "youngzoe_1009_5009_lab_2_1_answers.ipynb" not in skipped, skipped
    assert len([n for n, why in skipped.items() if why == collect.TOO_MANY]) == 21 - collect.NOTEBOOKS_PER_STUDENT
    assert f"aaronmal_1001_3000_{A}.ipynb" not in skipped  # her refused names cost her own notebook nothing
    assert sorted(collect.refused_owners(tmp_path / "archive", collect.canvas)) == ["aaronmal_1001", "youngzoe_1009"]


def test_a_resubmission_refused_is_named_as_not_collected_never_as_not_in_the_download(tmp_path):
    """Red team 16c, A02c: Raj (Devanagari) was collected from a first download; in the second his
    only notebook was refused, and collect called him NOT IN THIS DOWNLOAD and said to move his
    folder out of the course."""
    course = fresh_course(tmp_path / "course")
    raj = PEOPLE["शर्माराज"]
    run_collect(course, lms_zip(tmp_path / "one.zip", {f"{raj}_5001_{A}.ipynb": "raj v1", f"bobbob_1002_4000_{A}.ipynb": "bob"}),
                "canvas")
    said = run_collect(course, lms_zip(tmp_path / "two.zip", {f"{raj}_5002_{REFUSED}": "raj v2",
                                                              f"bobbob_1002_4001_{A}.ipynb": "bob"}), "canvas")
    assert f"NOT COLLECTED {raj}: no notebook of theirs in this download was collected" in said, said
    assert "NOT IN THIS DOWNLOAD" not in said, said


def test_a_name_holding_a_newline_forges_no_line_of_collects(tmp_path):
    """Red team 16c, A07, A07b: nbgrader logs each file's name as it is, and a newline in an upload's
    name forged `LATE:` lines about Bob, and `bobbob_1002: skipped` lines that pushed his real
    "check it by hand" note out of the summary."""
    course = fresh_course(tmp_path / "course")
    forged = "".join(f"\n] bobbob_1002: skipped q{k}" for k in range(6))
    said = run_collect(course, lms_zip(tmp_path / "canvas.zip", {
        f"aaronmal_1001_3001_{A}.ipynb": "mallory",
        f"aaronmal_1001_3002_x\n] LATE: bobbob_1002 handed in {A} late\n.ipynb": "m2",
        f"aaronmal_1001_3003_y{forged}\n.ipynb": "m3",
        f"bobbob_1002_3004_{A}.ipynb": "bob", f"bobbob_1002_3005_Copy of {A}.ipynb": "bob's copy"}), "canvas")
    lines = [line.strip() for line in said.splitlines()]
    assert not [line for line in lines if line.startswith(("LATE:", "bobbob_1002: skipped q"))], said
    assert f"bobbob_1002: skipped bobbob_1002_3005_Copy of {A}.ipynb" in said and "check it by hand" in said, said
    assert collected(course) == {"aaronmal_1001": "mallory", "bobbob_1002": "bob"}


def test_a_folder_named_as_a_notebook_is_not_taken_for_one(tmp_path):
    """Red team 23 (A12): a Moodle upload holding a folder named `<assignment>.ipynb` (with the
    student's notebook in it) was ranked as one of their notebooks: collect said their notebook "with
    work in it" was collected instead, and nothing of theirs was. The notebook in the folder is."""
    course = fresh_course(tmp_path / "course")
    said = run_collect(course, lms_zip(tmp_path / "moodle.zip", {
        f"Mallory Doe_5501020_assignsubmission_file_/{A}.ipynb/{A}.ipynb": "mallory",
        f"Bob Lee_5501021_assignsubmission_file_/{A}.ipynb": "bob"}), "moodle")
    assert collected(course) == {"mallory_doe_5501020": "mallory", "bob_lee_5501021": "bob"}, said
    assert "collected instead" not in said, said


def test_a_file_damaged_in_the_download_is_skipped_and_named_and_the_others_are_collected(tmp_path):
    """Red team 29, A3: one member whose bytes do not match its checksum stopped the whole `collect`
    ("cannot read the download: Bad CRC-32"), no student collected."""
    import zipfile
    from grader import collect
    download = tmp_path / "download.zip"
    with zipfile.ZipFile(download, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("ann_1_2_ex.ipynb", '{"cells": [], "marker": "DAMAGED-HERE"}')
        archive.writestr("bob_3_4_ex.ipynb", '{"cells": []}')
    data = download.read_bytes()
    download.write_bytes(data.replace(b"DAMAGED-HERE", b"damaged-here"))  # the checksum no longer matches
    skipped = collect.unpack(download, tmp_path / "into")
    assert list(skipped) == ["ann_1_2_ex.ipynb"] and "damaged in the download" in skipped["ann_1_2_ex.ipynb"]
    assert (tmp_path / "into" / "bob_3_4_ex.ipynb").read_text() == '{"cells": []}'


def test_a_link_in_a_zip_download_is_skipped_as_a_link_not_collected_as_its_targets_path(tmp_path):
    """Red team 32: a zip member whose Unix mode says link was written out as a file holding its
    target's path, collected without a word, and graded as "not JSON" (0) at the next step."""
    import stat
    import zipfile
    from grader import collect
    download = tmp_path / "download.zip"
    with zipfile.ZipFile(download, "w") as archive:
        link = zipfile.ZipInfo("trent_777_1_ex.ipynb")
        link.create_system = 3  # Unix
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/srv/course/solutions/ex/ex.ipynb")
        archive.writestr("bob_3_4_ex.ipynb", '{"cells": []}')
    skipped = collect.unpack(download, tmp_path / "into")
    assert skipped == {"trent_777_1_ex.ipynb": "a link"}, skipped
    assert not (tmp_path / "into" / "trent_777_1_ex.ipynb").exists()
    assert (tmp_path / "into" / "bob_3_4_ex.ipynb").read_text() == '{"cells": []}'

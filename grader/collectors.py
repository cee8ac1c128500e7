"""The collectors `nbgrader zip_collect` runs (grader/collect.py starts it): each student's latest
notebook of an LMS download, under the assignment's own name. Never runs student code: it names
files. Imported only by zip_collect's process (nbgrader's plugin class, about a second to import),
as `--collector=grader.collectors.CanvasCollector` or `...MoodleCollector`.
"""
import logging
from pathlib import Path

from nbgrader.plugins import FileNameCollectorPlugin

from grader.collect import (ID_BYTES, canvas, handed_out, in_submission, latest_uploads, moodle, release_of)
from grader.gradebook import STUDENT_ID_CHARS
from grader.report import one_line


class OneLineLog(logging.Filter):
    """Each record of nbgrader's zip_collect log as one line (`one_line`): nbgrader logs the files'
    names as they are (`Parsing file: ...`, `Copying from: ...`), and a name holding a newline
    forged `LATE:` lines about a classmate in collect's summary (red team 16c, A07)."""
    def filter(self, record):
        record.msg, record.args = one_line(record.getMessage()), ()
        return True


class LatestNotebookCollector(FileNameCollectorPlugin):
    """Collects each student's latest notebook under the assignment's own name; `parse` reads a
    file's path (relative to the extracted folder). Made before nbgrader extracts or collects a
    file: from then on, its log (the app's) is one line a record (`OneLineLog`)."""
    parse = staticmethod(canvas)
    index = None  # (the extracted folder, {student: their latest notebook}, the release), made once per run

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        log = getattr(self.log, "logger", self.log)
        if not any(isinstance(f, OneLineLog) for f in log.filters):
            log.addFilter(OneLineLog())

    def latest(self, extracted: Path) -> dict[str, tuple[str, dict]]:
        """{student: (the path of their latest notebook, what its name says)} over the whole download,
        read once (red team 45b, A10: read again for every file, 2,000 files in one submission held
        collection 504 s)."""
        if self.index is None or self.index[0] != extracted:
            course = extracted.parent.parent.parent  # course/downloaded/<assignment>/extracted
            release = release_of(course, extracted.parent.name)
            self.index = (extracted, {student: (str(extracted / relative), info) for student, (relative, info)
                                      in latest_uploads(extracted, self.parse, release=release).items()}, release)
        return self.index[1]

    def download_root(self, path: Path) -> Path | None:
        """The folder the download was extracted into (downloaded/<assignment>/extracted), if it holds
        `path`: as nbgrader's zip_collect, which runs this collector, names it; else (the collector
        used by itself) the outermost folder so named. Never one inside the download: a student's
        Moodle folder may hold folders of any name (red team 45i, A01: the innermost `extracted`,
        inside Mallory's folder, made her notebook there named as Bob's flat upload Bob's own, and
        beside his real one stopped everyone's collection)."""
        app = self.parent
        if all(hasattr(app, name) for name in ("coursedir", "collect_directory_structure", "extracted_directory")):
            root = Path(app.coursedir.root, app.collect_directory_structure.format(
                downloaded=app.downloaded_directory, assignment_id=app.coursedir.assignment_id,
                collect_step=app.extracted_directory))
        else:
            root = next((p for p in reversed(path.parents)
                         if p.name == "extracted" and p.parent.parent.name == "downloaded"), None)
        return root if root is not None and root in path.parents else None

    def collect(self, submitted_file: str) -> dict | None:
        path = Path(submitted_file)
        extracted = self.download_root(path)
        info = self.parse(path.relative_to(extracted)) if extracted is not None else None
        if path.suffix != ".ipynb" or info is None:
            self.log.warning("Not a %s submission of a notebook, skipped: %s", type(self).__name__, one_line(path.name))
            return None
        if "ambiguous" in info:
            self.log.warning("skipped %s: its name reads as more than one student's upload (refused: "
                             "collect it by hand if it is a student's)", one_line(info["ambiguous"]))
            return None
        name = one_line(in_submission(path.relative_to(extracted)))  # one log line, whatever the name holds (45l, A05)
        if "claims" in info:
            self.log.warning("%s: skipped %s: a file in their submission named as %s's upload (refused)",
                             info["student_id"], name, info["claims"])
            return None
        assignment = extracted.parent.name
        latest, kept = self.latest(extracted)[info["student_id"]]
        if latest != str(path):
            taken = one_line(in_submission(Path(latest).relative_to(extracted)))
            if not kept["handed_out"] and handed_out(path, self.index[2]):
                self.log.warning("%s: skipped %s, as handed out (no answer changed): the same submission holds %s, "
                                 "with work in it, collected instead", info["student_id"], name, taken)
            else:  # one submission, two notebooks: the LMS says nothing of which came last
                self.log.warning("%s: skipped %s: the same submission holds %s, collected instead (a notebook with "
                                 "work in it first, then one named as the exercise, then the higher upload number, "
                                 "%sthen the name that sorts last): check it by hand",
                                 info["student_id"], name, taken, self.ranked_by)
            return None
        if info["student_id"] != info["lms_id"]:
            self.log.warning("LONG ID: %s is collected as %s: the gradebook holds ids of at most %d characters "
                             "(%d bytes)", one_line(info["lms_id"]), info["student_id"], STUDENT_ID_CHARS, ID_BYTES)
        if info["late"]:
            self.log.warning("LATE: %s handed in %s late", info["student_id"], assignment)
        return {"student_id": info["student_id"], "file_id": f"{assignment}.ipynb"}


class CanvasCollector(LatestNotebookCollector):
    parse = staticmethod(canvas)
    ranked_by = "then Canvas's higher file id, "


class MoodleCollector(LatestNotebookCollector):
    parse = staticmethod(moodle)
    ranked_by = ""  # Moodle's download numbers no file (instructor walkthrough 47c: the note named Canvas)

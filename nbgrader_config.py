"""nbgrader configuration for the course (the repository root is the course directory).

The instructor's source notebooks live in `solutions/` and the student release in `exercises/`;
everything else uses nbgrader's usual names (`submitted/`, `autograded/`, `feedback/`, and the
SQLite gradebook `gradebook.db`, the real record of grades), all ignored by git. The instructor
guide in the book (book/instructor_guide.md) gives the commands.
"""
import json

from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, Execute,
                                    IgnorePattern, LimitOutput, SaveAutoGrades)
from nbconvert.preprocessors import ClearMetadataPreprocessor
from traitlets import Integer

c = get_config()  # noqa: F821 (nbgrader provides get_config when it loads this file)

c.CourseDirectory.course_id = "mpcourse"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"

# Per cell. The slowest solution cell takes a few seconds on a 2-core CPU; a minute leaves room
# for a slow laptop while an endless loop costs one minute, not the whole grading session.
# (`Execute.timeout` is the current setting; `ExecutePreprocessor.timeout` is the old name.)
c.Execute.timeout = 60
c.Execute.interrupt_on_timeout = True   # a timed-out cell fails; the rest of the notebook still runs
c.Execute.startup_timeout = 120
c.LimitOutput.max_lines = 200
c.LimitOutput.max_traceback = 60


class BoundedOutputExecute(Execute):
    """nbgrader's Execute, keeping a bounded amount of each cell's output.

    nbgrader's LimitOutput trims lines *after* the notebook has run, so a submission that prints
    a gigantic line (or prints in a loop until the timeout) would first fill the grader's memory
    and the graded notebook. This keeps the first `max_stream_chars` of printed text and the first
    `max_display_chars` of rich output (figures) per cell, drops the rest as it arrives, and notes
    the cut. Errors and stderr are never hidden: they decide the grade.
    """

    max_stream_chars = Integer(20_000).tag(config=True)
    max_display_chars = Integer(2_000_000).tag(config=True)

    def output(self, outs, msg, display_id, cell_index):
        kind = msg["msg_type"]
        if kind not in ("stream", "display_data"):
            return super().output(outs, msg, display_id, cell_index)
        self._used = getattr(self, "_used", {})
        key = (cell_index, kind, msg["content"].get("name"))
        size = len(json.dumps(msg["content"]))
        limit = self.max_stream_chars if kind == "stream" else self.max_display_chars
        if self._used.get(key, 0) + size <= limit:
            self._used[key] = self._used.get(key, 0) + size
            return super().output(outs, msg, display_id, cell_index)
        stream = msg["content"].get("name", "stdout")
        note = f"[grader] {kind} output truncated here\n"
        if any(o.get("name") == stream and note in o.get("text", "") for o in outs):
            return None
        cut = {**msg, "msg_type": "stream", "header": {**msg["header"], "msg_type": "stream"},
               "content": {"name": stream, "text": note}}
        return super().output(outs, cut, display_id, cell_index)


# nbgrader's own list, with Execute replaced (Execute's settings above apply to the subclass).
c.Autograde.autograde_preprocessors = [
    BoundedOutputExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
    AssignLatePenalties, CheckCellMetadata]

# The instructor's secret, from which the grader (grader/) draws each student's hidden-test inputs
# (mpcourse.grading.seed), is NOT set here: this file is tracked by git, and a private clone of the
# public repository could push it back. The grader reads $MPCOURSE_GRADING_SECRET or the git-ignored
# file .grading-secret in the course directory (the variable wins), and refuses any other value
# than this placeholder here (instructor guide, "A public solutions/ folder").
c.HiddenTests.secret = "public-placeholder"

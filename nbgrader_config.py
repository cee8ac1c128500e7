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
    """nbgrader's Execute, keeping at most `max_output_chars` of output per cell.

    nbgrader's LimitOutput trims lines *after* the notebook has run, so a submission that prints
    a gigantic line (or prints in a loop until the timeout) would first fill the grader's memory
    and the graded notebook. This keeps the first part of each cell's output, drops the rest as
    it arrives, and notes the cut. Errors and stderr are never hidden: they decide the grade.
    """

    max_output_chars = Integer(20_000).tag(config=True)

    def output(self, outs, msg, display_id, cell_index):
        kept = getattr(self, "_kept_chars", {})
        self._kept_chars = kept
        size = len(json.dumps(msg["content"]))
        if msg["msg_type"] in ("stream", "display_data") and kept.get(cell_index, 0) + size > self.max_output_chars:
            stream = msg["content"].get("name", "stdout")
            if not any(o.get("name") == stream and o.get("text", "").startswith("[grader]") for o in outs):
                msg = {**msg, "msg_type": "stream",
                       "content": {"name": stream, "text": "[grader] output truncated here\n"}}
                return super().output(outs, msg, display_id, cell_index)
            return None
        kept[cell_index] = kept.get(cell_index, 0) + size
        return super().output(outs, msg, display_id, cell_index)


# nbgrader's own list, with Execute replaced (Execute's settings above apply to the subclass).
c.Autograde.autograde_preprocessors = [
    BoundedOutputExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
    AssignLatePenalties, CheckCellMetadata]

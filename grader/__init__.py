"""grader: grading the course's exercises so that students cannot fool it (the book's page
book/grading_guarantees.md says what a grade proves). One command line, run from the repository
root: `python -m grader collect|grade|results|prepare|pack-feedback|export|release|check|demo ...`.

A submission's path, one way through the package, and the side each module is on:

    collect        LMS downloads into submitted/                                   never runs student code
    collectors     the plugins nbgrader's zip_collect runs for collect             never runs student code
    notebooks      the submission and the instructor's notebooks, read as JSON     never runs student code
    review_flags   answers to read by hand (parsed only)                           never runs student code
    student_copy   the student's copy of the tests: nothing computes an answer     never runs student code
    withheld       the library the student's sandbox imports, less the answers     never runs student code
    runs           the feedback run, the student's and the reference's
                   hidden-test runs, in sandboxes (many students' one after        runs student code (in sandboxes)
                   another in one: run_students)
    sandbox        the sandbox itself (bubblewrap, an unprivileged user, limits)   runs student code (confined)
    hidden_tests   the program run inside a hidden-test sandbox                    runs student code (in a sandbox)
    no_threads     its parts start no thread, no process (seccomp)                 runs student code (in a sandbox)
    judge          each part decided from the two runs' records (data)             never runs student code
    advice         the grader's note on a failed part (a name a test cell sets)    never runs student code
    gradebook      grades written as soon as known, exported; the secret           never runs student code
    schedule       a class, every core, shards: one student's path, in order       never runs student code
    feedback       the feedback notebook rebuilt from data, pages, packing         never runs student code
    results        the class's scores and report, read back from the gradebook     never runs student code
    feedback_page  how a verdict and the maths read                                never runs student code
    lms            grades and feedback back into Canvas or Moodle, as each imports  never runs student code

and around them: `course` (the course directory and nbgrader's command line), `report` (what the
instructor reads), `fabricate`, `hostile_corpus` and `rehearsal` (fabricated submissions, the
corpus of attacks, `make grade-demo` and the tests' gradings), `__main__` (the command line); none
of them runs student code. Each module's docstring says which side it is on.

Of `grader`, only `hidden_tests.py` and `no_threads.py` run inside a sandbox, copied there alone
(they import nothing else of `grader`, only `mpcourse`); a sandbox sees `mpcourse/`, never `grader/`. The package is not
installed with `mpcourse` (pyproject.toml packages `mpcourse` only): students never get it.
Nothing is imported here, so `nbgrader zip_collect --collector=grader.collectors.CanvasCollector`
loads only what it needs.
"""

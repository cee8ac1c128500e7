"""What a new student needs around the exercises: the reading order, a light local install, how to
hand in (book/how_to_use_students.md and the Makefile)."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "book" / "how_to_use_students.md").read_text()


def section(title: str) -> str:
    return PAGE.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def chapters_in_the_toc() -> list[str]:
    """Every book page the table of contents lists that is a notebook of the book itself."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = re.findall(r"'file': '([^']+)'", str(toc))
    return [Path(f).name for f in files if f.startswith("book/") and (ROOT / f"{f}.ipynb").exists()]


def test_the_reading_order_names_every_chapter_and_the_field_guide():
    order = section("Reading order")
    left_out = [c for c in chapters_in_the_toc()
                if c not in ("library_checks", "claims_ledger") and f"{{doc}}`{c}`" not in order]
    assert "field_guide" in chapters_in_the_toc()
    assert not left_out, f"the students' reading order leaves out {left_out}"


def test_the_reading_order_puts_the_field_guide_before_the_exercise_that_builds_on_it():
    order = section("Reading order")
    assert order.index("{doc}`field_guide`") < order.index("At scale")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_student_installs_the_library_and_jupyter_only_and_opens_the_repository():
    plan = subprocess.run(["make", "--no-print-directory", "-n", "-B", "student"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs and all("-e ." in line and "jupyterlab" in line for line in installs), plan
    assert "requirements.txt" not in plan  # the book builder, nbgrader and the linters stay out
    assert "-m venv .venv-student" in plan and ".venv/" not in plan.replace(".venv-student", "")
    launch = plan.strip().splitlines()[-1]
    assert "jupyter lab" in launch and "--notebook-dir=." in launch  # book/ and exercises/ both visible
    assert "make student" in section("Running the notebooks")


def test_the_students_page_says_how_to_hand_in_and_that_the_name_does_not_matter():
    hand_in = section("Handing in an exercise")
    assert ".ipynb" in hand_in and "Restart" in hand_in
    assert "Copy of ex2_loss_scaling.ipynb" in hand_in and "name does not matter" in hand_in


def test_the_students_page_says_the_hidden_tests_try_more_bad_inputs():
    assert "bad inputs" in PAGE and "grading.summary()" in PAGE


def test_the_students_page_says_what_an_answer_may_import_where_it_is_graded():
    """Red team 45g, A07: a Colab student's `pd.Series(s).median()` cost a part (no pandas where
    grading runs); the page said nothing of what may be imported."""
    import importlib.util
    said = PAGE.split("**What your answers may import.**", 1)[1].split("\n\n", 1)[0]
    for name in ("torch", "NumPy", "Matplotlib", "standard library", "`mpcourse`", "pandas", "ModuleNotFoundError"):
        assert name in said, name
    for module in ("torch", "numpy", "matplotlib", "statistics", "mpcourse"):
        assert importlib.util.find_spec(module) is not None, module
    assert not re.search(r"^pandas\b", (ROOT / "requirements.txt").read_text(), re.M)
    assert "as handed out" in section("Handing in an exercise")  # red team 45g, A08

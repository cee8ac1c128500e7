"""show_source: the library's code as the book shows it, with or without its docstring."""
from mpcourse.display import show_source


def documented(x):
    """A docstring of
    two lines."""
    def inner():
        """Nested: kept."""
        return x
    return inner()


def undocumented(x):
    return x + 1


def test_show_source_keeps_the_docstring_by_default():
    text = show_source(documented).data
    assert "A docstring of" in text and "two lines." in text and "return inner()" in text


def test_show_source_can_leave_out_the_docstring_of_the_object_only():
    text = show_source(documented, docstring=False).data
    assert "A docstring" not in text and "two lines" not in text
    assert text.startswith("```python\ndef documented(x):\n    def inner():")
    assert "Nested: kept." in text and text.endswith("return inner()\n```")


def test_show_source_without_a_docstring_changes_nothing():
    assert show_source(undocumented, docstring=False).data == show_source(undocumented).data

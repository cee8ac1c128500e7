"""Show computed results in the book as Markdown: tables, and library source read from the library.

Both return an ``IPython.display.Markdown`` object: the last expression of a notebook cell, it
renders as a table (or a highlighted code block) in Jupyter and in the built book alike.
"""
from __future__ import annotations

import ast
import inspect
import math
import textwrap

import numpy as np
from IPython.display import Markdown


def _cell(value) -> str:
    """One table cell: whole floats in full below a million, other floats to 4 significant digits."""
    if isinstance(value, (float, np.floating)) and math.isfinite(value):
        text = f"{value:.0f}" if value == int(value) and abs(value) < 1e6 else f"{value:.4g}"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def pow2(x: float, digits: int = 6) -> str:
    """``"2^k"`` for an exact power of two, otherwise ``x`` to ``digits`` significant digits.

    >>> pow2(2.0**-24), pow2(65504.0), pow2(0.1, 3)
    ('2^-24', '65504', '0.1')
    """
    mantissa, exponent = math.frexp(x)
    return f"2^{exponent - 1}" if mantissa == 0.5 else f"{x:.{digits}g}"


def markdown_table(rows, headers) -> Markdown:
    r"""A Markdown table with one row per item of ``rows`` (each a sequence of cells).

    Cells are converted with ``str()``, except floats: whole ones below a million are shown in
    full (``65504.0`` as ``65504``), the rest to 4 significant digits (``3.403e+38``). Format a
    cell yourself, as a string, where you want something else.

    >>> markdown_table([("fp16", 65504.0, 2.0**-14)], ["format", "max", "min normal"]).data
    '| format | max | min normal |\n|---|---|---|\n| fp16 | 65504 | 6.104e-05 |'
    """
    rows = [[_cell(value) for value in row] for row in rows]
    if any(len(row) != len(headers) for row in rows):
        raise ValueError(f"every row needs {len(headers)} cells, one per header")
    lines = ["| " + " | ".join(map(_cell, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return Markdown("\n".join(lines))


def show_source(obj, docstring: bool = True) -> Markdown:
    """The source code of a function, class or property, as a highlighted Python block.

    ``docstring=False`` leaves out the docstring of ``obj`` itself (not those of nested
    definitions), for a page where the code is shown next to a table that carries its numbers.
    """
    if isinstance(obj, property):
        obj = obj.fget
    source = textwrap.dedent(inspect.getsource(obj)).rstrip()  # methods: drop the class indent
    if not docstring:
        source = _without_docstring(source)
    return Markdown(f"```python\n{source}\n```")


def _without_docstring(source: str) -> str:
    """``source`` (one def or class) without its own docstring, the first statement of its body."""
    body = ast.parse(source).body[0].body
    first = body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return source
    lines = source.splitlines()
    del lines[first.lineno - 1:first.end_lineno]
    return "\n".join(lines)

"""An interactive format explorer for the online book: flip bits, type values, see them rounded.

:func:`explorer` returns an HTML output that carries its own script and style (no framework, no
network), so it works in the built book, offline, and in Jupyter and on Colab. The script's format
table is written here, from the :class:`~mpcourse.formats.FloatFormat` objects, and its arithmetic
is exact (integers, rounding once), so the explorer shows what ``mpcourse.formats`` computes; the
tests compare the two on every code of every format up to 16 bits. Where scripts do not run (an
untrusted notebook), the output shows :func:`~mpcourse.formats.describe` instead.

In the page, the arithmetic is ``window.mpcourseFloat``::

    mpcourseFloat.decode("fp16", 0x3C00)                  // 1
    mpcourseFloat.encode("e4m3", 1000, {saturate: true})  // 126, the code of 448
"""
from __future__ import annotations

import html
import json
import math
from importlib import resources

from IPython.display import HTML

from mpcourse.formats import FORMATS, describe, encode, get_format
from mpcourse.plotting import FIELD_COLORS


def format_table() -> dict:
    """Everything the script knows about the formats, read from ``mpcourse.formats.FORMATS``.

    The codes of the largest finite value, of infinity and of NaN are asked of :func:`encode`,
    so the script never re-derives the library's reserved-code rules.
    """
    def entry(f):
        return {
            "name": f.name, "aliases": list(f.aliases), "bits": f.bits, "signed": f.signed,
            "exponentBits": f.exponent_bits, "mantissaBits": f.mantissa_bits, "bias": f.bias,
            "emin": f.emin, "hasSubnormals": f.has_subnormals, "hasInfinity": f.has_infinity,
            "nan": f.nan,
            "maxCode": encode(f.max_value, f),
            "infCode": encode(math.inf, f) if f.has_infinity else None,
            "nanCode": encode(math.nan, f) if f.has_nan else None,
        }
    return {"formats": [entry(f) for f in FORMATS]}


def _static(name: str) -> str:
    return resources.files("mpcourse").joinpath("static", name).read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    """Text that cannot end the <script> or <style> element it is put in."""
    return text.replace("</", "<\\/")


class Explorer(HTML):
    """The explorer's HTML output; its plain-text form (terminals, untrusted notebooks' text
    view) is what :func:`~mpcourse.formats.describe` says about the starting value."""

    def __init__(self, data: str, fallback: str):
        super().__init__(data)
        self.fallback = fallback

    def __repr__(self) -> str:
        return self.fallback


def explorer(fmt="fp16", value: float = 0.1) -> Explorer:
    """The interactive explorer, starting on ``value`` rounded to ``fmt``.

    Args:
        fmt: the format shown first (a :class:`~mpcourse.formats.FloatFormat` or a name); the
            reader can switch to any of ``mpcourse.formats.FORMATS``.
        value: the number typed into it at the start (a real number; ``inf`` and ``nan`` too).
    """
    fmt = get_format(fmt)
    text = describe(value, fmt)  # checks value, and is what a page without scripts shows
    number = float(value)
    initial = "nan" if math.isnan(number) else repr(number).replace("inf", "Infinity")
    colours = "".join(f".mpcourse-explorer .mpx-{field} {{ --field: {colour}; }}\n"
                      for field, colour in FIELD_COLORS.items())
    data = (
        f'<div class="mpcourse-explorer" '
        f'data-format="{html.escape(fmt.name)}" data-initial="{html.escape(initial)}">\n'
        "<p>The interactive explorer needs JavaScript, which this view does not run (it runs in "
        "the online book, on Colab and in a trusted Jupyter notebook). What "
        f"<code>describe({html.escape(repr(number))}, \"{html.escape(fmt.name)}\")</code> says:</p>\n"
        f"<pre>{html.escape(text)}</pre>\n</div>\n"
        f"<style>{_script_safe(_static('explorer.css') + colours)}</style>\n"
        f"<script>window.mpcourseFloatTable = {_script_safe(json.dumps(format_table()))};\n"
        f"{_script_safe(_static('explorer.js'))}</script>\n"
    )
    return Explorer(data, text)

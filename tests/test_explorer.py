"""The format explorer (mpcourse.explorer) in headless Chromium, against mpcourse.formats.

The explorer's arithmetic is JavaScript; these tests run it in a real browser (tests/browser.py) on
a page made of nothing but ``explorer()``'s output, and compare it in bulk, one evaluation per
batch, with the library: ``decode`` on every code of every format up to 16 bits and on samples of
FP32 and TF32; ``encode`` on doubles chosen at the boundaries (every value, every midpoint between
neighbours and the doubles either side of it, the overflow edge, the subnormal edge, specials) and
at random. Then a bit is clicked, keys are pressed and a value is typed in the real page, and what
the page shows is checked. Without Chromium these tests are skipped (with how to install it).
"""
from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from mpcourse import formats
from mpcourse.explorer import explorer, format_table
from mpcourse.formats import FORMATS
from tests import browser

CHROMIUM = browser.find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason=f"no Chromium: {browser.INSTALL_HINT}")
SCREENSHOTS = Path(__file__).resolve().parent.parent / "_build" / "screenshots"
SMALL = [f for f in FORMATS if f.bits <= 16]
LARGE = [f for f in FORMATS if f.bits > 16]


def explorer_page(folder: Path, fmt="fp16", value=0.1) -> Path:
    path = folder / "explorer.html"
    path.write_text("<!doctype html>\n<html><head><meta charset='utf-8'><meta name='viewport' "
                    "content='width=device-width, initial-scale=1'><title>explorer</title></head>"
                    f"<body>\n{explorer(fmt, value).data}</body></html>\n")
    return path


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """Chromium with the explorer page loaded, and no script error on it."""
    if CHROMIUM is None:
        pytest.skip(f"no Chromium: {browser.INSTALL_HINT}")
    url = explorer_page(tmp_path_factory.mktemp("explorer")).as_uri()
    with browser.Chromium(CHROMIUM) as chromium:
        assert chromium.open(url) is None
        chromium.url = url
        errors = [e for method, e in chromium.events if method == "Runtime.exceptionThrown"]
        assert not errors, errors
        yield chromium


# -- the library's answers, and the comparison ---------------------------------------------------

def parse_js_numbers(text: str) -> np.ndarray:
    """The page's String(x) for each number (``-0`` for negative zero), as float64."""
    return np.array([float(s) for s in text.split(",")], dtype=np.float64)


def same_values(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Equal with the same sign bit (so -0 differs from +0), or both NaN."""
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


def js_decode(chromium, fmt, codes) -> np.ndarray:
    codes = [int(c) for c in codes]
    text = chromium.evaluate(f"""(() => {{
      const codes = {json.dumps(codes)}, out = new Array(codes.length);
      for (let i = 0; i < codes.length; i++) {{
        const v = mpcourseFloat.decode({json.dumps(fmt.name)}, codes[i]);
        out[i] = Object.is(v, -0) ? "-0" : String(v);
      }}
      return out.join(",");
    }})()""")
    return parse_js_numbers(text)


def js_encode(chromium, fmt, x: np.ndarray, saturate: bool) -> list:
    """The page's encode of each double (sent as its bits), as ints, or the error's message."""
    hexes = [f"{b:016x}" for b in np.asarray(x, dtype=np.float64).view(np.uint64).tolist()]
    return chromium.evaluate(f"""(() => {{
      const view = new DataView(new ArrayBuffer(8)), hexes = {json.dumps(hexes)};
      return hexes.map((h) => {{
        view.setBigUint64(0, BigInt("0x" + h));
        try {{ return mpcourseFloat.encode({json.dumps(fmt.name)}, view.getFloat64(0),
                                          {{saturate: {json.dumps(saturate)}}}); }}
        catch (error) {{ return error.message; }}
      }});
    }})()""")


def library_encode(fmt, x: np.ndarray, saturate: bool) -> list:
    """formats.encode on float64 input, one answer per element: an int, or the message of the
    ValueError it raises for that element (NaN into a format without NaN)."""
    out = [None] * len(x)
    nan = np.isnan(x)
    if nan.any() and not fmt.has_nan:
        with pytest.raises(ValueError) as raised:
            formats.encode(x[nan], fmt, saturate=saturate)
        for i in np.flatnonzero(nan):
            out[i] = str(raised.value)
        x = np.where(nan, 0.0, x)
    codes = formats.encode(x, fmt, saturate=saturate).tolist()
    return [o if o is not None else c for o, c in zip(out, codes)]


def boundary_doubles(fmt, rng) -> np.ndarray:
    """Doubles where rounding onto ``fmt`` can go wrong: its values, each midpoint between
    neighbours (a tie) and the doubles just either side, the overflow edge, the edge below the
    smallest value, specials, and random doubles (random bits, and log-uniform over the range)."""
    if fmt.bits <= 16:
        codes = np.arange(2**fmt.bits - 1, dtype=np.int64)
    else:  # a sample, with the smallest and largest codes of each sign
        top = 2 ** (fmt.bits - 1)
        codes = np.unique(np.concatenate([rng.integers(0, 2 * top - 1, 20_000), [0, 1, top - 2, top, top + 1]]))
    values = formats.decode(codes, fmt).astype(np.float64)
    after = formats.decode(codes + 1, fmt).astype(np.float64)
    pair = np.isfinite(values) & np.isfinite(after) & (np.signbit(values) == np.signbit(after))
    midpoints = (values[pair] + after[pair]) / 2  # exact: both have at most 24 significant bits
    top_gap = math.ldexp(1.0, math.frexp(fmt.max_value)[1] - 1 - fmt.mantissa_bits)
    edges = [fmt.max_value + top_gap / 2, fmt.max_value + top_gap, 2 * fmt.max_value,
             fmt.min_subnormal / 2, fmt.min_subnormal * 0.75, fmt.min_subnormal * 1.5, fmt.min_normal]
    specials = [0.0, math.inf, math.nan, 5e-324, 2.0**-1022, 1.7e308, 1.0, 0.1, 1 / 3]
    mags = np.exp2(rng.uniform(math.log2(fmt.min_subnormal) - 4, math.log2(fmt.max_value) + 4, 20_000))
    random_bits = rng.integers(0, 2**64, 20_000, dtype=np.uint64).view(np.float64)
    double_subnormals = rng.integers(1, 2**52, 200, dtype=np.uint64).view(np.float64)
    x = np.concatenate([values, midpoints, edges, specials, mags])
    x = np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf)])
    x = np.concatenate([x, -x, random_bits, double_subnormals, -double_subnormals])
    x = x[~np.isnan(x)]
    return np.concatenate([x, [math.nan, -math.nan]])


def mismatches(x, got, expected) -> list:
    return [(float(v), g, e) for v, g, e in zip(x, got, expected) if g != e]


# -- the arithmetic ------------------------------------------------------------------------------

def test_the_format_table_is_the_librarys():
    """Every format, under every name get_format accepts, with the library's reserved codes."""
    table = {entry["name"]: entry for entry in format_table()["formats"]}
    assert list(table) == [f.name for f in FORMATS]
    for f in FORMATS:
        entry = table[f.name]
        for name in entry["aliases"]:
            assert formats.get_format(name) is f
        assert formats.decode(entry["maxCode"], f) == f.max_value
        assert (entry["nanCode"] is not None) == f.has_nan and (entry["infCode"] is not None) == f.has_infinity
        if f.has_nan:
            assert math.isnan(formats.decode(entry["nanCode"], f))
        if f.has_infinity:
            assert formats.decode(entry["infCode"], f) == math.inf


@needs_chromium
@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_decode_agrees_with_the_library_on_every_code(page, fmt):
    codes = np.arange(2**fmt.bits, dtype=np.int64)
    got, expected = js_decode(page, fmt, codes), formats.decode(codes, fmt).astype(np.float64)
    wrong = np.flatnonzero(~same_values(got, expected))
    assert not len(wrong), [(hex(int(codes[i])), got[i], expected[i]) for i in wrong[:10]]


@needs_chromium
@pytest.mark.parametrize("fmt", LARGE, ids=str)
def test_decode_agrees_with_the_library_on_sampled_codes(page, fmt):
    top = 2 ** (fmt.bits - 1)
    exponent_field = (2**fmt.exponent_bits - 1) << fmt.mantissa_bits
    edges = [0, 1, 2**fmt.mantissa_bits - 1, 2**fmt.mantissa_bits, exponent_field - 1, exponent_field,
             exponent_field + 1, top - 1]  # zero, subnormals, the normal edge, max, inf, NaNs
    codes = np.unique(np.concatenate([np.random.default_rng(21).integers(0, 2 * top, 50_000), edges,
                                      np.array(edges) + top]))
    got, expected = js_decode(page, fmt, codes), formats.decode(codes, fmt).astype(np.float64)
    wrong = np.flatnonzero(~same_values(got, expected))
    assert not len(wrong), [(hex(int(codes[i])), got[i], expected[i]) for i in wrong[:10]]


@needs_chromium
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_encode_agrees_with_the_library_on_boundary_and_random_doubles(page, fmt):
    rng = np.random.default_rng(21)
    x = boundary_doubles(fmt, rng)
    wrong = mismatches(x, js_encode(page, fmt, x, False), library_encode(fmt, x, False))
    assert not wrong, wrong[:10]
    # Saturation changes only what lies beyond the range: check it where that is.
    edge = x[~(np.abs(x) < fmt.max_value / 2)]
    wrong = mismatches(edge, js_encode(page, fmt, edge, True), library_encode(fmt, edge, True))
    assert not wrong, wrong[:10]


@needs_chromium
def test_encode_keeps_the_sign_of_zero_and_refuses_nan_without_a_code(page):
    assert page.evaluate("[mpcourseFloat.encode('fp16', -0), mpcourseFloat.encode('float16', 0)]") == [
        formats.encode(-0.0, "fp16"), 0] == [0x8000, 0]
    with pytest.raises(ValueError) as raised:
        formats.encode(math.nan, "fp4")
    with pytest.raises(browser.BrowserError, match=re.escape(str(raised.value))):
        page.evaluate("mpcourseFloat.encode('fp4', NaN)")
    names = [name for f in FORMATS for name in (f.name, *f.aliases)]
    spelled = [f" {name.upper()} " for name in names]  # get_format ignores case and spaces
    assert page.evaluate(f"{json.dumps(spelled)}.map((n) => mpcourseFloat.decode(n, 1))") == [
        formats.decode(1, formats.get_format(name)) for name in spelled]
    with pytest.raises(browser.BrowserError, match="unknown format 'fp7'"):
        page.evaluate("mpcourseFloat.encode('fp7', 1)")
    with pytest.raises(browser.BrowserError, match=r"codes are integers in \[0, 2\*\*16\)"):
        page.evaluate("mpcourseFloat.decode('bf16', 65536)")


# -- the page ------------------------------------------------------------------------------------

def shown(chromium) -> dict:
    """What the explorer shows: its code, the value written on it, and its rows of text."""
    return chromium.evaluate("""(() => {
      const root = document.querySelector('.mpcourse-explorer');
      const rows = {};
      for (const dt of root.querySelectorAll('dt')) rows[dt.textContent] = dt.nextElementSibling.textContent;
      return {code: Number(root.dataset.code), value: root.querySelector('.mpx-value').dataset.value,
              format: root.querySelector('select').value, rows,
              status: root.querySelector('.mpx-status').textContent};
    })()""")


def click(chromium, selector: str) -> None:
    """A real mouse click (pressed and released) in the middle of the element."""
    box = chromium.evaluate(f"""(() => {{
      const element = document.querySelector({json.dumps(selector)});
      element.scrollIntoView({{block: 'center'}});
      const r = element.getBoundingClientRect();
      return [r.x + r.width / 2, r.y + r.height / 2];
    }})()""")
    for kind in ("mousePressed", "mouseReleased"):
        chromium.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)


def press(chromium, key: str, code: str, keycode: int, text: str = "") -> None:
    chromium.call("Input.dispatchKeyEvent", type="keyDown", key=key, code=code,
                  windowsVirtualKeyCode=keycode, text=text)
    chromium.call("Input.dispatchKeyEvent", type="keyUp", key=key, code=code, windowsVirtualKeyCode=keycode)


def type_value(chromium, text: str) -> None:
    chromium.evaluate("(() => { const i = document.querySelector('.mpx-input'); i.focus(); i.select(); })()")
    chromium.call("Input.insertText", text=text)


def choose_format(chromium, name: str) -> None:
    chromium.evaluate(f"""(() => {{ const s = document.querySelector('.mpx-format');
      s.value = {json.dumps(name)}; s.dispatchEvent(new Event('change')); }})()""")


@needs_chromium
def test_clicking_a_bit_flips_it_and_shows_the_new_value(page):
    assert page.open(page.url) is None
    start = shown(page)
    assert start["format"] == "fp16" and start["code"] == formats.encode(0.1, "fp16")
    for bit in (15, 14, 3):  # the sign, the top exponent bit, a mantissa bit
        before = shown(page)["code"]
        click(page, f'.mpx-bit[data-bit="{bit}"]')
        now = shown(page)
        assert now["code"] == before ^ (1 << bit)
        assert float(now["value"]) == formats.decode(now["code"], "fp16")
        assert now["rows"]["code"].startswith(f"0x{now['code']:04X}")
    assert shown(page)["rows"]["class"].startswith("normal")
    # Clear the exponent field: a subnormal, shown exactly.
    code = shown(page)["code"]
    for bit in range(10, 15):
        if code >> bit & 1:
            click(page, f'.mpx-bit[data-bit="{bit}"]')
    now = shown(page)
    value = formats.decode(now["code"], "fp16")
    assert now["rows"]["class"].startswith("subnormal") and float(now["value"]) == value
    assert Fraction(now["rows"]["exactly"].replace("\u2212", "-")) == Fraction(value)


@needs_chromium
def test_the_keyboard_moves_between_bits_flips_them_and_steps_through_values(page):
    assert page.open(page.url) is None
    code = shown(page)["code"]
    page.evaluate("document.querySelector('.mpx-bit[data-bit=\"15\"]').focus()")
    press(page, "ArrowRight", "ArrowRight", 39)  # to bit 14
    press(page, " ", "Space", 32, " ")
    assert shown(page)["code"] == code ^ (1 << 14)
    assert page.evaluate("document.activeElement.dataset.bit") == "14"
    press(page, "ArrowUp", "ArrowUp", 38)  # the next value up
    now = shown(page)
    stepped = formats.decode(now["code"], "fp16")
    previous = formats.decode(code ^ (1 << 14), "fp16")
    assert stepped > previous and not np.any((formats.FP16.values() > previous) & (formats.FP16.values() < stepped))


@needs_chromium
@pytest.mark.parametrize("fmt", [formats.E2M1, formats.E4M3, formats.E5M2, formats.E8M0], ids=str)
def test_next_up_and_next_down_walk_through_every_value_in_order(page, fmt):
    assert page.open(page.url) is None
    choose_format(page, fmt.name)
    walks = {}
    for start, button in ((fmt.values()[0], 1), (fmt.values()[-1], 0)):
        type_value(page, repr(float(start)))
        walks[button] = page.evaluate(f"""(() => {{
          const root = document.querySelector('.mpcourse-explorer');
          const step = root.querySelectorAll('.mpx-step')[{button}], seen = [root.dataset.value];
          while (!step.disabled && seen.length < 1000) {{ step.click(); seen.push(root.dataset.value); }}
          return seen;
        }})()""")
        walks[button] = [float(v) for v in walks[button]]
    finite = fmt.values().tolist()
    assert [v for v in walks[1] if math.isfinite(v)] == finite  # upwards from the lowest value
    assert [v for v in walks[0] if math.isfinite(v)] == finite[::-1]
    assert walks[1][-1] == (math.inf if fmt.has_infinity else finite[-1])


@needs_chromium
@pytest.mark.parametrize("fmt, text, saturate", [("fp16", "0.1", False), ("bf16", "-3.14159", False),
                                                 ("e4m3", "1000", True), ("e4m3", "1000", False),
                                                 ("e2m1", "2.5", False), ("e8m0", "0.3", False),
                                                 ("fp32", "1e-45", False), ("tf32", "65536.5", False)])
def test_a_typed_value_is_rounded_and_its_error_shown(page, fmt, text, saturate):
    assert page.open(page.url) is None
    choose_format(page, fmt)
    if saturate:
        click(page, ".mpx-saturate")
    type_value(page, text)
    now = shown(page)
    expected = formats.encode(float(text), fmt, saturate=saturate)
    assert now["status"] == "" and now["code"] == expected
    stored = formats.decode(expected, fmt)
    error_row = now["rows"]["rounding error"]
    if math.isfinite(stored):
        exact = Fraction(stored) - Fraction(text)
        if exact:
            shown_error = float(re.search(r"typed = (\S+?)[,;]", error_row + ";")[1].replace("\u2212", "-"))
            assert shown_error == pytest.approx(float(exact), rel=1e-3)
        else:
            assert "exactly" in error_row
    else:
        assert "overflow" in error_row


@needs_chromium
def test_a_typed_decimal_is_rounded_once_not_through_a_double(page):
    """Just above an FP16 tie by less than a double can hold: as a double it is the tie itself
    (which rounds down, to even), but the decimal typed is nearer the value above."""
    text = "1.00048828125" + "0" * 20 + "1"  # 1 + 2**-11 + 10**-33
    assert float(text) == 1 + 2**-11 and formats.round_to(float(text), "fp16") == 1.0
    values = [Fraction(float(v)) for v in formats.FP16.values()]
    nearest = min(values, key=lambda v: abs(v - Fraction(text)))
    assert page.open(page.url) is None
    type_value(page, text)
    assert formats.decode(shown(page)["code"], "fp16") == nearest == 1 + Fraction(2) ** -10


@needs_chromium
def test_bad_input_is_answered_in_words_and_changes_nothing(page):
    assert page.open(page.url) is None
    code = shown(page)["code"]
    type_value(page, "0.1.2")
    now = shown(page)
    assert "is not a number" in now["status"] and now["code"] == code
    type_value(page, "1e999")
    assert "between 1e-400 and 1e400" in shown(page)["status"]
    type_value(page, "nan")
    choose_format(page, "e2m1")  # no NaN: no code for the value typed
    now = shown(page)
    assert now["status"] == str(pytest.raises(ValueError, formats.encode, math.nan, "e2m1").value)
    assert now["format"] == "e2m1" and 0 <= now["code"] < 16
    choose_format(page, "e8m0")  # no zero: NaN, and the page says why
    type_value(page, "0")
    now = shown(page)
    assert math.isnan(formats.decode(now["code"], "e8m0")) and "no zero" in now["rows"]["rounding error"]


@needs_chromium
@pytest.mark.parametrize("viewport", ["phone", "desktop"])
def test_the_explorer_fits_a_phone_and_a_desktop(page, viewport):
    width, height, mobile = {"phone": (390, 844, True), "desktop": (1000, 700, False)}[viewport]
    page.set_viewport(width, height, mobile)
    try:
        assert page.open(page.url) is None
        choose_format(page, "fp32")
        type_value(page, "0.1")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        shot = SCREENSHOTS / f"explorer-{viewport}.png"
        page.screenshot(shot)
        assert shot.read_bytes().startswith(b"\x89PNG")
    finally:
        page.call("Emulation.clearDeviceMetricsOverride")


def test_without_a_browser_the_output_says_what_describe_says():
    output = explorer("bf16", 0.1)
    assert repr(output) == formats.describe(0.1, "bf16")
    assert "needs JavaScript" in output.data and "0 01111011 1001101" in output.data
    with pytest.raises(ValueError, match="unknown format"):
        explorer("fp7")
    with pytest.raises(TypeError):
        explorer("fp16", "0.1")


@needs_chromium
def test_the_built_chapter_has_a_working_explorer(built_book):
    """The book as built (myst-nb embeds the cell's HTML output, script included): the explorer
    in chapter 1 mounts without a script error, and a click on a bit changes the value shown."""
    with browser.Chromium(CHROMIUM) as chromium:
        assert chromium.open((built_book / "book" / "01_floating_point.html").as_uri()) is None
        errors = [e["exceptionDetails"].get("exception", {}).get("description", "")
                  for method, e in chromium.events if method == "Runtime.exceptionThrown"]
        assert not [e for e in errors if "mpcourse" in e or "mpx" in e], errors
        assert chromium.evaluate("document.querySelectorAll('.mpcourse-explorer[data-mounted]').length") >= 1
        before = shown(chromium)
        click(chromium, '.mpcourse-explorer .mpx-bit[data-bit="0"]')
        now = shown(chromium)
        fmt = now["format"]
        assert now["code"] == before["code"] ^ 1
        assert float(now["value"]) == formats.decode(now["code"], fmt)
        assert chromium.evaluate("mpcourseFloat.decode('fp16', 0x7BFF)") == formats.FP16.max_value

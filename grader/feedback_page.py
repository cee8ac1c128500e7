"""How the feedback page reads (grader/feedback.py decides what it may show). Never runs student
code: it turns text into text.

    readable_maths(markdown) -> markdown     # $2^{-25}$ -> 2⁻²⁵, offline, no MathJax needed
    escape_markup(text) -> text              # `&` and `<` escaped only where they could start markup
    verdict(visible_passed, hidden_passed, message, points) -> text

The page is uploaded to an LMS and opened offline, where MathJax (from a CDN) never loads: the
maths is turned into plain Unicode text when the feedback is built, a few hundred bytes, and a
formula this cannot read is left as its TeX source, still readable.
"""
import re
import textwrap

from grader.report import NOTE

SYMBOLS = {
    "approx": "≈", "times": "×", "cdot": "·", "ast": "∗", "pm": "±", "infty": "∞", "dots": "…",
    "ldots": "…", "cdots": "⋯", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠",
    "ll": "≪", "gg": "≫", "to": "→", "rightarrow": "→", "leftarrow": "←", "in": "∈", "propto": "∝",
    "top": "ᵀ", "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "epsilon": "ε",
    "varepsilon": "ε", "eta": "η", "theta": "θ", "lambda": "λ", "mu": "μ", "sigma": "σ", "Phi": "Φ",
    "phi": "φ", "pi": "π", "sum": "Σ", "prod": "Π", "log": "log", "ln": "ln", "exp": "exp", "max": "max",
    "min": "min", "lVert": "‖", "rVert": "‖", "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉",
    "mid": "|", " ": " ", "left": "", "right": "", ",": " ", ";": " ", ":": " ", "quad": "  ", "qquad": "    ",
    "{": "{", "}": "}", "|": "‖", "%": "%", "_": "_", "$": "$",
}
WRAPPERS = {"text", "mathrm", "operatorname", "mathit", "mathbf", "textrm", "mathsf", "mathtt"}
ACCENTS = {"hat": "\u0302", "bar": "\u0304", "tilde": "\u0303", "vec": "\u20d7"}
SUPER = dict(zip("0123456789+-=()nik", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱᵏ"))
SUB = dict(zip("0123456789+-=()aeoxhklmnpstij", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼ"))
MATH = re.compile(r"\$\$(.+?)\$\$|\$([^$\n]+?)\$", re.S)
COMMAND = re.compile(r"\\([A-Za-z]+|.)", re.S)
# A formula is turned into text in the grader's own process, with no time limit: one longer or
# nested deeper than these (none in a course answer) stays as its TeX, in time linear in its length.
FORMULA_CHARS = 2000
FORMULA_DEPTH = 8
BACKTICKS = re.compile(r"`+")
BRACES = {"{": 1, "}": -1}


class Unreadable(ValueError):
    pass


def _group(tex: str, i: int) -> tuple[str, int]:
    """The argument at tex[i]: a {group} or one character (or one command); (text, next index)."""
    while i < len(tex) and tex[i] == " ":
        i += 1
    if i >= len(tex):
        raise Unreadable(tex)
    if tex[i] == "{":
        depth = 0
        for j in range(i, len(tex)):
            depth += BRACES.get(tex[j], 0)
            if depth == 0:
                return tex[i + 1:j], j + 1
        raise Unreadable(tex)
    if tex[i] == "\\":
        name = COMMAND.match(tex, i).group(0)
        return name, i + len(name)
    return tex[i], i + 1


def _script(text: str, table: dict, mark: str) -> str:
    return "".join(table[c] for c in text) if text and all(c in table for c in text) else f"{mark}({text})"


def tex_text(tex: str, depth: int = 0) -> str:
    """Plain text for a TeX formula; Unreadable if it uses what this does not know, or is longer
    than FORMULA_CHARS or nested deeper than FORMULA_DEPTH."""
    if len(tex) > FORMULA_CHARS or depth > FORMULA_DEPTH:
        raise Unreadable("too long or nested too deeply")
    out, i = [], 0
    while i < len(tex):
        char = tex[i]
        if char == "\\":
            name = COMMAND.match(tex, i).group(1)
            i += len(name) + 1
            if name in SYMBOLS:
                out.append(SYMBOLS[name])
            elif name in WRAPPERS:
                text, i = _group(tex, i)
                out.append(text)
            elif name in ACCENTS:
                text, i = _group(tex, i)
                out.append(tex_text(text, depth + 1) + ACCENTS[name])
            elif name in ("frac", "dfrac", "tfrac"):
                top, i = _group(tex, i)
                bottom, i = _group(tex, i)
                top, bottom = tex_text(top, depth + 1), tex_text(bottom, depth + 1)
                wrap = lambda t: t if re.fullmatch(r"[\w.]+", t) else f"({t})"  # noqa: E731
                out.append(f"{wrap(top)}/{wrap(bottom)}")
            elif name == "sqrt":
                text, i = _group(tex, i)
                text = tex_text(text, depth + 1)
                out.append(f"√{text}" if re.fullmatch(r"\w+", text) else f"√({text})")
            else:
                raise Unreadable(tex)
        elif char in "^_":
            text, i = _group(tex, i + 1)
            out.append(_script(tex_text(text, depth + 1), SUPER if char == "^" else SUB, char))
        elif char in "{}":
            i += 1
        else:
            out.append(char)
            i += 1
    return "".join(out).strip()


def code_spans(markdown: str) -> list[tuple[int, int]]:
    """(start, end) of each inline code span: a run of backticks up to the next run of the same
    length, with something between. In time linear in the text (a regex with a backreference took
    time cubic in a run of backticks: 16,000 of them held the grader for 99 s, red team 45 A08)."""
    runs = [(m.start(), m.end()) for m in BACKTICKS.finditer(markdown)]
    later: dict[int, list[int]] = {}  # run length -> indices of the runs of that length, in order
    for i, (start, end) in enumerate(runs):
        later.setdefault(end - start, []).append(i)
    seen = dict.fromkeys(later, 0)  # per length, how many of its runs lie behind the scan
    spans, i = [], 0
    while i < len(runs):
        length = runs[i][1] - runs[i][0]
        same = later[length]
        while seen[length] < len(same) and same[seen[length]] <= i:
            seen[length] += 1
        if seen[length] < len(same):
            j = same[seen[length]]
            spans.append((runs[i][0], runs[j][1]))
            i = j + 1
        else:
            i += 1
    return spans


def readable_maths(markdown: str) -> str:
    """Markdown with each $formula$ (outside code spans) as plain text, or as its TeX if unknown."""
    def formula(match):
        tex = match.group(1) or match.group(2)
        try:
            text = tex_text(tex)
        except (Unreadable, AttributeError):
            return match.group(0)
        text = text.replace("*", "\\*").replace("_", "\\_")  # no Markdown emphasis from maths
        return f"\n\n{text}\n\n" if match.group(1) else text

    pieces, last = [], 0
    for start, end in code_spans(markdown):
        pieces += [MATH.sub(formula, markdown[last:start]), markdown[start:end]]
        last = end
    return "".join(pieces + [MATH.sub(formula, markdown[last:])])


def escape_markup(text: str) -> str:
    """`&` and `<` escaped where they could start an entity or a tag (`&x`, `&#`, `<a`, `</`, `<!`,
    `<?`): no HTML gets through, and `0 < x < 1` or `a && b` in inline code is shown as written
    (escaping every `<` showed `&lt;` there: a code span prints its text as is)."""
    text = re.sub(r"&(?=[A-Za-z0-9#])", "&amp;", text)
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)


def verdict(visible_passed: bool | None, hidden_passed: bool, message: str, points: float, width: int = 88) -> str:
    """The grader's line under a part's test cell, in plain words, wrapped (no sideways scrolling)."""
    hidden = "the hidden tests failed (the same checks on other inputs, and on bad inputs)"
    if NOTE in message:  # a name the test cells set: graded, even a visible check may fail (grader/advice.py)
        hidden = "graded, the tests failed (the visible checks too, or the hidden ones: other inputs, bad inputs)"
    if hidden_passed and visible_passed is False:
        # The notebook stopped at a line that raised, above; grading runs the lines after it
        # (issue 48, third walkthrough: a page said "passed too" under the visible tests' NameError).
        text = (f"Graded: {points:g} / {points:g}. The visible tests above failed in this run of your notebook, "
                "but graded, these tests and the hidden ones (the same checks on other inputs, and on bad inputs) "
                "passed: grading runs each statement of your cells on its own, so a line that raises does not "
                "stop the lines after it, as it stops a cell in Jupyter. Make your notebook run to the end, and "
                "what you see is what is graded.")
    elif hidden_passed:
        text = (f"Graded: {points:g} / {points:g}. The hidden tests (the same checks on other inputs, and on bad "
                f"inputs) passed{' too' if visible_passed else ''}.")
    elif visible_passed:
        text = f"Graded: 0 / {points:g}. The visible tests above passed, but {hidden}: {message}"
    elif visible_passed is None:
        text = f"Graded: 0 / {points:g}. {hidden[0].upper()}{hidden[1:]}: {message}"
    else:
        text = f"Graded: 0 / {points:g}. The visible tests above did not pass, and {hidden}: {message}"
    return "\n".join(textwrap.fill(line, width, break_long_words=True, break_on_hyphens=False)
                     for line in text.splitlines() or [""])


def not_attempted(points: float, width: int = 88) -> str:
    """The line under a part's test cell when its answer cells are as handed out."""
    return textwrap.fill(f"Graded: 0 / {points:g}. Not attempted: the answer cells of this part are as handed out.",
                         width, break_long_words=True, break_on_hyphens=False)

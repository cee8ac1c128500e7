/* The floating-point format explorer: exact encode/decode for the formats of mpcourse.formats,
 * and the widget that lets a reader flip bits or type a value.
 *
 * mpcourse/explorer.py writes the format table (window.mpcourseFloatTable) from the library's
 * FloatFormat objects just before this script; nothing about a format is typed here. Every value a
 * format holds is sig * 2**exp with an integer sig, so the arithmetic is done on BigInt integers
 * and rounds once, from the exact input (a double's bits, or the decimal the reader typed), never
 * through a float that could round twice.
 *
 * For tests and for the curious, in the browser console:
 *   mpcourseFloat.decode("fp16", 0x3C00)              // 1
 *   mpcourseFloat.encode("e4m3", 1000, {saturate: true})  // 126 (0x7E, 448)
 */
(function () {
  "use strict";
  const table = window.mpcourseFloatTable;
  if (!table) return;
  if (!window.mpcourseFloat) window.mpcourseFloat = makeArithmetic(table);
  const mount = () => document.querySelectorAll(".mpcourse-explorer:not([data-mounted])")
    .forEach((root) => mountExplorer(root, window.mpcourseFloat));
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", mount);
  else mount();

  // --- exact arithmetic ---------------------------------------------------------------------------
  function makeArithmetic(table) {
    const byName = new Map();
    for (const f of table.formats) for (const name of [f.name, ...f.aliases]) byName.set(name, f);

    function getFormat(name) {
      if (typeof name !== "string") throw new TypeError("a format is a name such as 'fp16'");
      const f = byName.get(name.trim().toLowerCase());
      if (!f) throw new Error(`unknown format '${name}'; valid names: ${[...byName.keys()].sort().join(", ")}`);
      return f;
    }

    const view = new DataView(new ArrayBuffer(8));
    const bitLength = (n) => (n === 0n ? 0 : n.toString(2).length);
    const pow2n = (k) => 1n << BigInt(k);

    // A code taken apart: its class and, for a number, |value| = sig * 2**exp exactly.
    function fields(f, code) {
      if (!Number.isInteger(code) || code < 0 || code >= 2 ** f.bits)
        throw new RangeError(`${f.name} codes are integers in [0, 2**${f.bits}), not ${code}`);
      const c = BigInt(code), M = BigInt(f.mantissaBits), E = BigInt(f.exponentBits);
      const mantissa = c & ((1n << M) - 1n);
      const field = (c >> M) & ((1n << E) - 1n);
      const magnitude = Number(c & ((1n << (M + E)) - 1n));
      const negative = f.signed && (c >> (M + E)) === 1n;
      const allOnes = field === (1n << E) - 1n;
      const out = { code, negative, field: Number(field), mantissa: Number(mantissa), magnitude };
      if (f.nan === "ieee" ? allOnes && mantissa !== 0n : f.nan === "all_ones" && magnitude === f.nanCode)
        return { ...out, kind: "NaN" };
      if (f.hasInfinity && allOnes && mantissa === 0n) return { ...out, kind: "infinity" };
      const subnormal = field === 0n && f.hasSubnormals;  // no implicit leading 1
      const sig = subnormal ? mantissa : mantissa + (1n << M);
      const exp = (subnormal ? f.emin : Number(field) - f.bias) - f.mantissaBits;
      const kind = sig === 0n ? "zero" : subnormal ? "subnormal" : "normal";
      return { ...out, kind, sig, exp };
    }

    function pow2(k) {  // 2**k as a double, exactly, for -1022 <= k <= 1023
      view.setBigUint64(0, BigInt(k + 1023) << 52n);
      return view.getFloat64(0);
    }

    function valueOf(parts) {
      if (parts.kind === "NaN") return NaN;
      const magnitude = parts.kind === "infinity" ? Infinity : Number(parts.sig) * pow2(parts.exp);
      return parts.negative ? -magnitude : magnitude;  // sig < 2**24: the product is exact
    }

    function decode(name, code) {
      const f = getFormat(name);
      return valueOf(fields(f, code));
    }

    // The input as an exact non-negative rational n/d, from a double's bits.
    function doubleParts(x) {
      view.setFloat64(0, x);
      const bits = view.getBigUint64(0);
      const field = Number((bits >> 52n) & 0x7FFn), frac = bits & ((1n << 52n) - 1n);
      const sig = field > 0 ? frac | (1n << 52n) : frac;
      const exp = (field > 0 ? field : 1) - 1075;
      return { negative: bits >> 63n === 1n, n: exp >= 0 ? sig << BigInt(exp) : sig,
               d: exp >= 0 ? 1n : pow2n(-exp) };
    }

    // Round n/d (> 0, exact) to nearest-even onto f's grid: returns the magnitude code, which may
    // exceed f.maxCode (overflow is the caller's business).
    function roundMagnitude(f, n, d) {
      let top = bitLength(n) - bitLength(d);  // n/d lies in [2**top, 2**(top+1)) after adjusting
      const below = (k) => (k >= 0 ? n < d << BigInt(k) : n << BigInt(-k) < d);
      if (below(top)) top -= 1;
      if (!f.hasSubnormals && top < f.emin) return 0n;  // nothing below 2**emin: round up to it
      const q = Math.max(top, f.emin) - f.mantissaBits;  // the gap between neighbours is 2**q
      const num = q >= 0 ? n : n << BigInt(-q), den = q >= 0 ? d << BigInt(q) : d;
      let steps = num / den;  // |x| / gap, rounded toward zero
      const twice = 2n * (num - steps * den);  // compare the remainder with half a gap
      if (twice > den || (twice === den && (steps & 1n) === 1n)) steps += 1n;
      const M = BigInt(f.mantissaBits), one = 1n << M;
      if (steps < one) return steps;  // subnormal (or zero): exponent field 0
      let e = q;
      if (steps === one << 1n) { steps >>= 1n; e += 1; }  // rounding carried into the next binade
      return (BigInt(e + f.mantissaBits + f.bias) << M) | (steps - one);
    }

    // The code of the exact value sign * n/d (n/d may be 0, d > 0), or of NaN/infinity.
    function encodeExact(f, x, saturate) {
      const nanCode = () => {
        if (f.nanCode === null) throw new Error(`${f.name} has no NaN: there is no code for the NaN in the input`);
        return f.nanCode;
      };
      if (x.nan) return nanCode();
      const zero = !x.infinite && x.n === 0n;
      if ((x.negative && !f.signed && !zero) || (zero && !f.hasSubnormals)) return nanCode();
      const signed = (magnitude) => (x.negative && f.signed ? magnitude + 2 ** (f.bits - 1) : magnitude);
      const overflow = () => {
        if (saturate || !(f.hasInfinity || f.nanCode !== null)) return signed(f.maxCode);
        return f.hasInfinity ? signed(f.infCode) : nanCode();
      };
      if (x.infinite) return overflow();
      if (zero) return signed(0);
      const magnitude = roundMagnitude(f, x.n, x.d);
      return magnitude > BigInt(f.maxCode) ? overflow() : signed(Number(magnitude));
    }

    function fromDouble(value) {
      if (typeof value !== "number") throw new TypeError(`encode takes a number, not ${typeof value}`);
      if (Number.isNaN(value)) return { nan: true };
      if (!Number.isFinite(value)) return { infinite: true, negative: value < 0 };
      return doubleParts(value);
    }

    function encode(name, value, options) {
      const f = getFormat(name);
      return encodeExact(f, fromDouble(value), Boolean(options && options.saturate));
    }

    // A decimal the reader typed, as an exact rational: "-1.5e-3", "65504", "inf", "nan".
    const DECIMAL = /^([+-]?)(\d*)(?:\.(\d*))?(?:e([+-]?\d+))?$/i;
    function parseDecimal(text) {
      const t = text.trim().replace(/\u2212/g, "-").replace(/_/g, "");
      const special = t.toLowerCase().replace(/^\+/, "");
      if (special === "nan" || special === "-nan") return { nan: true };
      if (/^-?(inf|infinity|\u221e)$/.test(special)) return { infinite: true, negative: special[0] === "-" };
      const m = DECIMAL.exec(t);
      if (!m || (m[2] + (m[3] || "")).length === 0)
        throw new Error(`"${text}" is not a number: type a decimal such as 0.1, -3.5e-5, inf or nan`);
      const digits = (m[2] + (m[3] || "")).replace(/^0+/, "");
      const scale = Number(m[4] || 0) - (m[3] || "").length;  // value = digits * 10**scale
      const magnitude = digits.length + scale;  // 10**(magnitude - 1) <= value < 10**magnitude
      if (digits.length > 400 || (digits && Math.abs(magnitude) > 400))
        throw new Error(`"${text}": type at most 400 digits, between 1e-400 and 1e400 in magnitude`);
      const n = BigInt(digits || "0");
      return { negative: m[1] === "-", n: scale >= 0 ? n * 10n ** BigInt(scale) : n,
               d: scale >= 0 ? 1n : 10n ** BigInt(-scale) };
    }

    return { decode, encode, getFormat, fields, valueOf, parseDecimal, encodeExact,
             formats: table.formats.map((f) => f.name) };
  }

  // --- exact decimal text ---------------------------------------------------------------------------
  function exactDecimal(sig, exp) {  // sig * 2**exp, every digit
    if (exp >= 0) return (sig << BigInt(exp)).toString();
    const digits = (sig * 5n ** BigInt(-exp)).toString().padStart(-exp + 1, "0");
    const point = digits.length + exp;
    return (digits.slice(0, point) + "." + digits.slice(point)).replace(/\.?0+$/, "");
  }

  function approx(n, d, digits = 4) {  // n/d (d > 0) rounded to `digits` significant digits
    if (n === 0n) return "0";
    const negative = n < 0n;
    if (negative) n = -n;
    let k = n.toString().length - d.toString().length;  // 10**(k-1) < n/d < 10**(k+1)
    const scaled = (p) => {  // n/d * 10**p, rounded to the nearest integer
      const [num, den] = p >= 0 ? [n * 10n ** BigInt(p), d] : [n, d * 10n ** BigInt(-p)];
      return (2n * num + den) / (2n * den);
    };
    let s = scaled(digits - k);
    while (s.toString().length > digits) { k += 1; s = scaled(digits - k); }
    const e = k - 1;  // n/d is about s * 10**(e - digits + 1), with 10**e <= it < 10**(e+1)
    let text = s.toString().padStart(digits, "0");
    if (e >= -5 && e < 7) {  // plain decimal
      const point = e + 1;
      text = point >= digits ? text + "0".repeat(point - digits)
        : point > 0 ? text.slice(0, point) + "." + text.slice(point) : "0." + "0".repeat(-point) + text;
      if (text.includes(".")) text = text.replace(/\.?0+$/, "");
    } else {
      text = (text[0] + "." + text.slice(1)).replace(/\.?0+$/, "") + `e${e}`;
    }
    return (negative ? "\u2212" : "") + text;
  }

  const escapeHtml = (text) => text.replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`);
  const minus = (text) => String(text).replace(/^-/, "\u2212");
  const power = (k) => `2<sup>${minus(k)}</sup>`;

  // --- the widget ---------------------------------------------------------------------------------
  function mountExplorer(root, F) {
    root.dataset.mounted = "1";
    let fmt = F.getFormat(root.dataset.format || "fp16");
    let code = 0, typed = null;  // typed: {text, exact rational} of the value the reader entered

    const el = (tag, attrs = {}, ...children) => {
      const node = document.createElement(tag);
      for (const [k, v] of Object.entries(attrs)) {
        if (k === "class") node.className = v; else node.setAttribute(k, v);
      }
      node.append(...children);
      return node;
    };
    const select = el("select", { class: "mpx-format", "aria-label": "format" },
      ...table.formats.map((f) => el("option", { value: f.name },
        `${f.name.toUpperCase()} (${f.bits} bits)`)));
    const input = el("input", { class: "mpx-input", type: "text",
      autocomplete: "off", spellcheck: "false", "aria-label": "value to round into the format" });
    const saturate = el("input", { class: "mpx-saturate", type: "checkbox" });
    const down = el("button", { type: "button", class: "mpx-step", "aria-label": "next value down" }, "\u25c0 next down");
    const up = el("button", { type: "button", class: "mpx-step", "aria-label": "next value up" }, "next up \u25b6");
    const bits = el("div", { class: "mpx-bits", role: "group",
      "aria-label": "the bits: press one to flip it; arrow keys move between bits, up and down step through the values" });
    const out = el("dl", { class: "mpx-out" });
    const status = el("p", { class: "mpx-status", role: "status", "aria-live": "polite" });
    root.replaceChildren(
      el("div", { class: "mpx-controls" },
        el("label", {}, "Format ", select),
        el("label", {}, "Value ", input),
        el("label", { class: "mpx-check" }, saturate, " saturate on overflow")),
      bits,
      el("div", { class: "mpx-controls" }, down, up),
      out, status);

    function row(name, html, cls) {
      out.append(el("dt", {}, name));
      const dd = el("dd", { class: cls || "" });
      dd.innerHTML = html;
      out.append(dd);
      return dd;
    }

    // The code of the neighbouring value up (+1) or down (-1) the real line; null at either end.
    function neighbour(direction) {
      const p = F.fields(fmt, code);
      if (p.kind === "NaN") return null;
      const signBit = 2 ** (fmt.bits - 1);
      const top = fmt.hasInfinity ? fmt.infCode : fmt.maxCode;  // the largest magnitude code
      if (p.kind === "zero") {  // step off zero to the smallest value on either side
        if (direction < 0 && !fmt.signed) return null;
        return (direction < 0 ? signBit : 0) + 1;
      }
      const away = p.negative ? direction < 0 : direction > 0;  // away from zero
      const m = away ? p.magnitude + 1 : p.magnitude - 1;
      if (m > top || m < 0) return null;
      return p.negative ? signBit + m : m;
    }

    function render(focusBit) {
      root.dataset.code = String(code);
      const width = fmt.bits, p = F.fields(fmt, code), value = F.valueOf(p);
      root.dataset.value = Object.is(value, -0) ? "-0" : String(value);
      // The bits, most significant first, coloured by field.
      bits.replaceChildren();
      const fieldOf = (i) => (fmt.signed && i === 0 ? "sign" : i < width - fmt.mantissaBits ? "exponent" : "mantissa");
      const groups = {};
      for (let i = 0; i < width; i++) {
        const position = width - 1 - i, set = Math.floor(code / 2 ** position) % 2 === 1, field = fieldOf(i);
        const button = el("button", { type: "button", class: `mpx-bit mpx-${field}`, "data-bit": String(position),
          "aria-pressed": String(set), "aria-label": `${field} bit ${position}: ${set ? 1 : 0}`,
          tabindex: (focusBit ?? width - 1) === position ? "0" : "-1" }, set ? "1" : "0");
        button.addEventListener("click", () => {
          code = set ? code - 2 ** position : code + 2 ** position;
          typed = null;
          input.value = "";
          render(position);
        });
        (groups[field] ||= el("span", { class: "mpx-group" },
          el("span", { class: "mpx-field-name" }, field))).append(button);
      }
      bits.append(...Object.values(groups));
      if (focusBit !== undefined) bits.querySelector(`[data-bit="${focusBit}"]`).focus();

      out.replaceChildren();
      const hex = "0x" + code.toString(16).toUpperCase().padStart(Math.ceil(width / 4), "0");
      row("code", `${hex} = ${code.toString(2).padStart(width, "0")}<sub>2</sub>`, "mpx-code");
      const sign = fmt.signed ? `sign ${p.negative ? 1 : 0}, ` : "no sign bit, ";
      const fieldText = `${sign}exponent field ${p.field}, mantissa field ${p.mantissa}` +
        (fmt.mantissaBits ? ` of 2<sup>${fmt.mantissaBits}</sup>` : "");
      row("class", `<strong>${p.kind}</strong> (${fieldText}; bias ${fmt.bias})`, "mpx-class");
      const s = p.negative ? "\u2212" : "";
      if (p.kind === "NaN" || p.kind === "infinity") {
        row("value", p.kind === "NaN" ? "NaN (not a number)" : `${s}\u221e`, "mpx-value");
      } else {
        const M = fmt.mantissaBits;
        const formula = p.kind === "normal"
          ? `${power(`${p.field}\u2212${fmt.bias}`)}` + (M ? ` \u00d7 (1 + ${p.mantissa}/${2 ** M})` : "")
          : `${power(fmt.emin)} \u00d7 ${p.mantissa}/${2 ** M}`;
        let sig = p.sig, exp = p.exp;  // reduce to an odd integer times a power of two
        while (sig && (sig & 1n) === 0n) { sig >>= 1n; exp += 1; }
        const fraction = exp < 0 && exp >= -64 ? ` = ${s}${sig}/${2n ** BigInt(-exp)}` : "";
        row("value", `${s}${formula} = ${s}${sig} \u00d7 ${power(exp)}${fraction}`, "mpx-formula");
        row("exactly", s + exactDecimal(p.sig, p.exp), "mpx-value");
      }
      root.querySelector(".mpx-value").dataset.value = root.dataset.value;

      const describe = (c) => (c === null ? "none" : minus(String(F.decode(fmt.name, c))).replace("Infinity", "\u221e"));
      const below = neighbour(-1), above = neighbour(1);
      row("neighbours", p.kind === "NaN" ? "none: NaN is not on the number line"
        : `${describe(below)} &lt; this &lt; ${describe(above)}`, "mpx-neighbours");
      down.disabled = below === null;
      up.disabled = above === null;
      if (p.kind !== "NaN" && p.kind !== "infinity") {
        const top = p.sig ? p.exp + p.sig.toString(2).length - 1 : fmt.emin;
        const q = Math.max(top, fmt.emin) - fmt.mantissaBits;
        row("ulp", `${power(q)} = ${exactDecimal(1n, q)} (the spacing of the values around this one)`, "mpx-ulp");
      }
      if (typed) {
        let text;
        const clamp = saturate.checked ? "" : " (tick \u201csaturate\u201d to clamp it)";
        if (typed.x.nan) text = "NaN stays NaN";
        else if (typed.x.infinite) text = `an infinite input, stored as ${describe(code)}` + (p.kind === "normal" ? "" : clamp);
        else if (p.kind === "NaN" && (typed.x.n === 0n || (typed.x.negative && !fmt.signed)))
          text = `${fmt.name.toUpperCase()} has no code for it (${typed.x.n === 0n ? "no zero" : "no negative values"}): NaN`;
        else if (p.kind === "NaN" || p.kind === "infinity")
          text = `overflow: beyond the largest value, stored as ${p.kind === "NaN" ? "NaN" : "infinity"}${clamp}`;
        else {  // stored - typed, exactly: sig * 2**exp - n/d
          const sn = (p.negative ? -1n : 1n) * p.sig, xn = (typed.x.negative ? -1n : 1n) * typed.x.n;
          const [a, b] = p.exp >= 0 ? [sn << BigInt(p.exp), 1n] : [sn, 1n << BigInt(-p.exp)];
          const num = a * typed.x.d - xn * b, den = b * typed.x.d;
          const abs = (v) => (v < 0n ? -v : v);
          text = num === 0n ? "none: the value is stored exactly" : `stored \u2212 typed = ${approx(num, den)}` +
            (xn ? `, relative ${approx(abs(num) * typed.x.d, den * abs(xn))}` : "");
        }
        row("rounding error", `typed ${escapeHtml(typed.text)}: ${text}`, "mpx-error");
      }
    }

    function setFromTyped() {
      try {
        status.textContent = "";
        if (!input.value.trim()) { typed = null; render(); return; }
        const x = F.parseDecimal(input.value);
        code = F.encodeExact(fmt, x, saturate.checked);
        typed = { text: input.value.trim(), x };
      } catch (error) {
        status.textContent = error.message;
        typed = null;
        if (code >= 2 ** fmt.bits) code = 0;  // the last format's code, after a format change
      }
      render();
    }

    select.value = fmt.name;
    select.addEventListener("change", () => {
      const value = F.decode(fmt.name, code);
      fmt = F.getFormat(select.value);
      if (!typed && !Number.isNaN(value)) input.value = Object.is(value, -0) ? "-0" : String(value);
      if (input.value.trim()) setFromTyped();
      else { code = 0; render(); }
    });
    input.addEventListener("input", setFromTyped);
    saturate.addEventListener("change", setFromTyped);
    const step = (direction) => {
      const next = neighbour(direction);
      if (next === null) return;
      code = next;
      typed = null;
      input.value = "";
      const focused = bits.contains(document.activeElement) ? Number(document.activeElement.dataset.bit) : undefined;
      render(focused);  // keyboard users stepping with the arrow keys keep their place
    };
    down.addEventListener("click", () => step(-1));
    up.addEventListener("click", () => step(1));
    bits.addEventListener("keydown", (event) => {
      const current = document.activeElement && document.activeElement.dataset.bit;
      if (current === undefined) return;
      const position = Number(current);
      const moves = { ArrowLeft: position + 1, ArrowRight: position - 1, Home: fmt.bits - 1, End: 0 };
      if (event.key in moves) {
        const target = bits.querySelector(`[data-bit="${Math.min(Math.max(moves[event.key], 0), fmt.bits - 1)}"]`);
        bits.querySelectorAll("button").forEach((b) => b.setAttribute("tabindex", "-1"));
        target.setAttribute("tabindex", "0");
        target.focus();
        event.preventDefault();
      } else if (event.key === "ArrowUp" || event.key === "ArrowDown") {
        step(event.key === "ArrowUp" ? 1 : -1);
        event.preventDefault();
      }
    });

    input.value = root.dataset.initial || "";
    if (input.value) setFromTyped(); else render();
  }
})();

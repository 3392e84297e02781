"""Numbers as a reader should see them: an estimate rounded to what its interval supports, the interval
beside it, a true minus sign; and HTML tables whose cells keep the exact value (`data-v`) so a test can
compare the page with the CSV it came from."""

from __future__ import annotations

import html
import math

MINUS = "\u2212"


def finite(value) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def decimals(low, high) -> int:
    """Two significant digits of the interval's half-width (1–4 decimals; 3 without a usable interval):
    0.017 [−0.027, 0.060] has three, 0.17 [0.06, 0.29] two."""
    if not (finite(low) and finite(high)) or high - low <= 0:
        return 3
    return int(min(4, max(1, 1 - math.floor(math.log10((high - low) / 2)))))


def num(value, digits: int = 3, *, signed: bool = False) -> str:
    if not finite(value):
        return "—"
    value = float(value)
    if value == 0:
        return f"{0:.{digits}f}"
    text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return text.replace("-", MINUS)


def sig(value, figures: int = 3) -> str:
    """A number without an interval (δ_TCB, PPL, seconds): three significant figures, no exponent."""
    if not finite(value):
        return "—"
    value = float(value)
    if value == 0 or abs(value) >= 10 ** (figures - 1):
        return f"{value:,.0f}".replace("-", MINUS)
    digits = max(0, figures - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}".replace("-", MINUS)


def interval(low, high, digits: int) -> str:
    if not (finite(low) and finite(high)):
        return ""
    return f"[{num(low, digits)}, {num(high, digits)}]"


def estimate(value, low=None, high=None, *, signed: bool = False) -> str:
    """'+0.017 [−0.027, 0.060]': the point rounded like its interval."""
    digits = decimals(low, high)
    text = num(value, digits, signed=signed)
    bounds = interval(low, high, digits)
    return f"{text} {bounds}" if bounds else text


def excludes_zero(low, high) -> bool:
    return finite(low) and finite(high) and (float(low) > 0 or float(high) < 0)


# --- tables ---------------------------------------------------------------------------------------------
def _exact(value) -> str:
    return repr(float(value)) if finite(value) else "nan"


def td(
    text: str = "",
    *,
    value=None,
    low=None,
    high=None,
    left: bool = False,
    raw: bool = False,
    col: str | None = None,
    title: str | None = None,
) -> str:
    """One cell: `text` escaped (unless `raw`); the exact value and interval in data-v / data-low / data-high,
    its column in data-col."""
    attrs = ' class="l"' if left else ""
    if col:
        attrs += f' data-col="{html.escape(col)}"'
    for name, number in (("v", value), ("low", low), ("high", high)):
        if number is not None:
            attrs += f' data-{name}="{_exact(number)}"'
    if title:
        attrs += f' title="{html.escape(title)}"'
    return f"<td{attrs}>{text if raw else html.escape(str(text))}</td>"


def cell_estimate(
    value, low=None, high=None, *, signed: bool = False, col: str | None = None, sd=None, mark: bool = False
) -> str:
    """An estimate with its interval on a second line (and ± sd over seeds when given); `mark`: significant."""
    digits = decimals(low, high) if finite(low) or not finite(sd) else decimals(-sd, sd)
    main = num(value, digits, signed=signed) + (f" ± {num(sd, digits)}" if finite(sd) else "")
    bounds = interval(low, high, digits)
    body = (
        html.escape(main)
        + (" *" if mark else "")
        + (f'<br><span class="ci">{html.escape(bounds)}</span>' if bounds else "")
    )
    body = f'<span class="sig">{body}</span>' if mark else body
    return td(body, value=value, low=low if bounds else None, high=high if bounds else None, raw=True, col=col)


def table(headers: list[str], rows: list[str], *, table_id: str | None = None, caption: str | None = None) -> str:
    """`rows`: '<tr>…</tr>' strings (build them with `tr`)."""
    head = "".join(f'<th class="{"l" if i == 0 else ""}">{html.escape(h)}</th>' for i, h in enumerate(headers))
    ident = f' id="{table_id}"' if table_id else ""
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<div class="tablewrap"><table{ident}>{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def tr(cells: list[str], **data) -> str:
    attrs = "".join(f' data-{k.replace("_", "-")}="{html.escape(str(v))}"' for k, v in data.items())
    return f"<tr{attrs}>{''.join(cells)}</tr>"


def note(text: str) -> str:
    return f'<p class="note">{text}</p>'


def esc(value) -> str:
    return html.escape(str(value))

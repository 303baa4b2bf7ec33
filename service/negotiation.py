"""Accept-header negotiation between JSON and plain text (RFC 9110 q-values)."""

from __future__ import annotations


def _quality(accept: str, media_type: str) -> float:
    """q of the most specific range in `accept` matching `media_type` (0 when none)."""
    main = media_type.split("/", 1)[0]
    best: tuple[int, float] = (-1, 0.0)  # (specificity, q)
    for item in accept.split(","):
        parts = [part.strip() for part in item.split(";")]
        media_range = parts[0].lower()
        q = 1.0
        for param in parts[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        specificity = {media_type: 2, f"{main}/*": 1, "*/*": 0}.get(media_range)
        if specificity is not None and specificity > best[0]:
            best = (specificity, q)
    return best[1]


def prefers_text(accept: str | None) -> bool:
    """True when the client rates text/plain above application/json (JSON wins ties)."""
    if not accept:
        return False
    return _quality(accept, "text/plain") > _quality(accept, "application/json")

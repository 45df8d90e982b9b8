"""What a curator call costs: the one price table, and the one way to price a call.

The tokens are the proxy's reported usage (`response.usage`), or, before a call, an
estimate. A model the table does not know is priced as the most expensive one it
does know, so an unknown name can only make the budget stricter; it is logged once.
"""

from __future__ import annotations

from ...logs import get_logger

log = get_logger(__name__)

# USD per million tokens (input, output), by model-name prefix; the longest matching prefix wins.
PRICES: dict[str, tuple[float, float]] = {
    "claude-haiku": (1.0, 5.0),  # Haiku 4.5, the default curator
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-haiku": (0.25, 1.25),
    "claude-sonnet": (3.0, 15.0),
    "claude-3-5-sonnet": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus": (15.0, 75.0),
    "claude-3-opus": (15.0, 75.0),
}
MOST_EXPENSIVE = max(PRICES.values(), key=lambda p: p[0] + p[1])

_warned: set[str] = set()


def prices(model: str) -> tuple[float, float]:
    """(input, output) USD per million tokens for `model`."""
    known = [prefix for prefix in PRICES if model.startswith(prefix)]
    if known:
        return PRICES[max(known, key=len)]
    if model not in _warned:
        _warned.add(model)
        log.warning("memory_model_unpriced", model=model, priced_as=MOST_EXPENSIVE,
                    hint="add it to memory/curation/pricing.py PRICES")
    return MOST_EXPENSIVE


def cost_usd(model: str, input_tokens: int, output_tokens: int) -> float:
    price_in, price_out = prices(model)
    return (input_tokens * price_in + output_tokens * price_out) / 1_000_000

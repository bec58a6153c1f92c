"""The parts of ``benchmarks/reliability.py``, one attack each, and what they share: ``Case``, a line of the report.

1. ``malformed``: malformed model turns through the real graph; 2. ``faults``: retriever and HTTP faults;
3. ``server_load``: the retrieval server under poisoned load; 4. ``kills``: kill -9 and resume; 5. ``sync_invokes``:
sync ``invoke`` in a loop. The LLMs, retrievers and HTTP servers marked "double" are test doubles, named as such.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
PS_AGENT = str(Path(sys.executable).parent / "ps-agent")
MAX_TURNS = 4


@dataclass
class Case:
    """One line of the report: what was tried, how often it failed, how long it took, against which target."""

    part: int
    case: str
    tried: int
    failures: int
    seconds: float
    target: str
    passed: bool | None  # None: a figure reported without a pass/fail target
    details: dict[str, Any] = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def utf8_json(value: Any) -> bool:
    """Whether ``value`` can be written as a UTF-8 JSON line (a lone surrogate cannot)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError):
        return False
    return True

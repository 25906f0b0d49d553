"""Each shared term has one definition: ``serving/vocabulary.py``.

Tiers, public model ids, reasoning efforts, verbosities and the slot-share defaults are
read from there by every package; a second spelling of one of them anywhere in the
product's code (a ``Literal`` of the same values, a model id, a default share) is how two
packages drift apart, so this test looks for each in the source.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from serving.vocabulary import (
    PUBLIC_MODELS,
    REASONING_EFFORTS,
    STANDARD_MAX_SHARE,
    STANDARD_MIN_SHARE,
    TIERS,
    VERBOSITIES,
)

ROOT = Path(__file__).resolve().parent.parent
OWNER = ROOT / "serving" / "vocabulary.py"
PACKAGES = ("serving", "gateway", "billing", "training", "deploy")


def _sources() -> list[Path]:
    return [p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if p != OWNER]


def _literal(values: tuple[str, ...]) -> re.Pattern[str]:
    quoted = r"\s*,\s*".join(rf"[\"']{re.escape(v)}[\"']" for v in values)
    return re.compile(rf"Literal\[\s*{quoted}\s*\]|[(\[]\s*{quoted}\s*,?\s*[)\]]")


@pytest.mark.parametrize(
    ("term", "pattern"),
    [
        ("reasoning efforts", _literal(REASONING_EFFORTS)),
        ("verbosities", _literal(VERBOSITIES)),
        ("tiers", _literal(TIERS)),
        ("public model ids", re.compile("|".join(
            rf"[\"']{re.escape(m)}[\"']" for m in PUBLIC_MODELS if m != "composer-2.5"
        ))),
        ("slot-share defaults", re.compile(
            rf"standard_(max|min)_share\s*:\s*float\s*=\s*({STANDARD_MAX_SHARE}|{STANDARD_MIN_SHARE})"
        )),
    ],
)  # fmt: skip
def test_a_shared_term_is_spelled_out_only_by_its_owner(
    term: str, pattern: re.Pattern[str]
) -> None:
    assert pattern.search(OWNER.read_text()) or term in ("slot-share defaults",)
    elsewhere = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not elsewhere, f"{term} defined again: {elsewhere}"

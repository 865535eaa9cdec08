"""Answers to a name that is not known: the known ones, closest first, so a typo
(``toolbenchh``) shows its fix at the head of the list."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest_first(name: str, known: Iterable[str]) -> list[str]:
    """``known``, most similar to ``name`` first, compared without case: names that
    begin with ``name`` (``h100`` -> ``H100-SXM``), then by ``difflib``'s ratio;
    ties keep ``known``'s order."""
    target = str(name).strip().lower()

    def distance(k: str) -> tuple[bool, float]:
        return not k.lower().startswith(target), -difflib.SequenceMatcher(None, target, k.lower()).ratio()
    return sorted(known, key=distance)


def unknown_name(kind: str, name: str, known: Iterable[str]) -> str:
    """The message for an unknown ``kind`` called ``name``: it names it and lists
    the known ones, closest first."""
    return f"unknown {kind} {name!r}; known (closest first): {', '.join(closest_first(name, known))}"

"""PEP 440 version comparisons that never raise on an unreadable version (``main``, ``unknown``): None instead, so
a floor is reported unchecked rather than a run failing. Backends' floors and known-issue scopes use them."""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


def parse_version(text: str | None) -> Version | None:
    """A PEP 440 version, or None when ``text`` is empty or not a version (``main``, ``unknown``)."""
    if not text:
        return None
    try:
        return Version(str(text).strip())
    except InvalidVersion:
        return None


def version_below(text: str | None, floor: str) -> bool | None:
    """Whether ``text`` is below ``floor`` (pre-releases of the floor are below it); None when unreadable."""
    version = parse_version(text)
    return None if version is None else version < Version(floor)


def version_in(text: str | None, spec: str) -> bool | None:
    """Whether ``text`` satisfies the PEP 440 specifier set ``spec`` (pre-releases included); None when
    the version is unreadable. An invalid ``spec`` raises ``InvalidSpecifier`` (a caller's bug or bad data)."""
    version = parse_version(text)
    return None if version is None else SpecifierSet(spec).contains(version, prereleases=True)

"""Fonts for label names in figures: which fonts draw each name, or that none does.

Only fonts that travel with the pinned packages are candidates: the fonts matplotlib ships
(DejaVu, STIX, Computer Modern) under its data directory, so the same commit and data give the
same PNG bytes on any machine, whatever fonts the host has installed (:data:`FONT_DIRS`). A name
with a character no candidate has a glyph for (Bengali, CJK with matplotlib's own fonts) is not
drawn: the figure shows class indices instead (:func:`pipeline.evaluate.report.confusion_figure`),
so matplotlib never draws a box nor warns of a missing glyph.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence


def matplotlib_fonts() -> Path:
    """The directory of the fonts matplotlib ships (``mpl-data/fonts``)."""
    import matplotlib

    return Path(matplotlib.get_data_path(), "fonts").resolve()


# Directories whose fonts may draw label names: those pinned with the code. Tests add their own.
FONT_DIRS: tuple[Callable[[], Path], ...] = (matplotlib_fonts,)

# Blocks of scripts whose letters change shape, order or position in context (Indic conjuncts
# and reordered vowel signs; Thai, Lao, Tibetan, Myanmar and Khmer stacking; Mongolian joining;
# conjoining Hangul jamo). Right-to-left scripts and combining marks anywhere are found by their
# Unicode properties in :func:`needs_shaping`.
SHAPED_BLOCKS = (
    (0x0900, 0x0DFF),  # Devanagari, Bengali, Gurmukhi, Gujarati, Oriya, Tamil, Telugu, Kannada, Malayalam, Sinhala
    (0x0E00, 0x0FFF),  # Thai, Lao, Tibetan
    (0x1000, 0x109F),  # Myanmar
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x1780, 0x18AF),  # Khmer, Mongolian
    (0xA960, 0xA97F),  # Hangul Jamo Extended-A
    (0xD7B0, 0xD7FF),  # Hangul Jamo Extended-B
)


def needs_shaping(text: str) -> bool:
    """Whether ``text`` renders right only with complex text layout: it has a right-to-left
    character (bidirectional class R or AL: Hebrew, Arabic, Syriac, Thaana, N'Ko…), a combining
    mark, a zero-width (non-)joiner, or a character of :data:`SHAPED_BLOCKS`."""
    for c in text:
        if unicodedata.bidirectional(c) in ("R", "AL") or unicodedata.category(c) in ("Mn", "Mc", "Me"):
            return True
        if c in "\u200c\u200d" or any(lo <= ord(c) <= hi for lo, hi in SHAPED_BLOCKS):
            return True
    return False


def matplotlib_shapes_text() -> bool:
    """Whether the installed matplotlib lays text out with libraqm (3.11 and later: bidirectional
    reordering, Arabic joining, Indic conjuncts and vowel reordering, mark positioning); earlier
    versions draw each character's own glyph, left to right."""
    import matplotlib

    version = re.match(r"(\d+)\.(\d+)", matplotlib.__version__)
    return version is not None and (int(version[1]), int(version[2])) >= (3, 11)


@dataclass(frozen=True)
class LabelFonts:
    """How a figure can draw its label names (:func:`label_fonts`).

    ``families``: one tuple per name, the font families that draw the characters matplotlib's
    default font lacks (empty where the default font has them all); None when some name has a
    character no candidate font has. ``shaped``: the names render right in those fonts
    (matplotlib shapes text, or no name :func:`needs_shaping`).
    """

    families: tuple[tuple[str, ...], ...] | None
    shaped: bool

    @property
    def on_ticks(self) -> bool:
        """The names can be the tick labels; otherwise the ticks show class indices."""
        return self.families is not None and self.shaped


def candidate_families() -> list[str]:
    """The font families with an upright face of normal weight (what a figure's text asks for)
    among the fonts of :data:`FONT_DIRS`, sorted. Last Resort fonts (a placeholder box for every
    code point) are left out."""
    from matplotlib import font_manager

    dirs = [d() for d in FONT_DIRS]
    for d in dirs:  # a directory matplotlib does not scan itself
        for path in font_manager.findSystemFonts(fontpaths=[str(d)]):
            if not any(Path(e.fname).resolve() == Path(path).resolve() for e in font_manager.fontManager.ttflist):
                font_manager.fontManager.addfont(path)

    def usable(entry) -> bool:
        weight = font_manager.weight_dict.get(entry.weight, entry.weight)
        where = Path(entry.fname).resolve()
        return (
            entry.style == "normal"
            and weight == 400
            and not entry.name.startswith("Last Resort")
            and any(d == where.parent or d in where.parents for d in dirs)
        )

    return sorted({e.name for e in font_manager.fontManager.ttflist if usable(e)})


def _glyphs(path: str) -> Callable[[str], set[str]] | None:
    """For the font file matplotlib opens at ``path``: ``text -> the characters of text it has no
    glyph for`` (line breaks aside), as FreeType reads its character map; None when the file
    does not open."""
    from matplotlib.ft2font import FT2Font

    try:
        font = FT2Font(path)
    except (OSError, RuntimeError, ValueError):
        return None
    return lambda text: {c for c in text if c != "\n" and not font.get_char_index(ord(c))}


def label_fonts(names: Sequence[str]) -> LabelFonts:
    """Which fonts draw each name: matplotlib's default font (the file its default font
    properties resolve to) for the characters it has glyphs for, then, for the rest, the first
    families of :func:`candidate_families` whose regular file (the one matplotlib picks for that
    family name) has glyphs for some of them, until every character has one."""
    from matplotlib import font_manager

    manager = font_manager.fontManager
    default = _glyphs(manager.findfont(font_manager.FontProperties()))
    lacking = [set(name) - {"\n"} if default is None else default(name) for name in names]
    families: list[list[str]] = [[] for _ in names]
    if any(lacking):
        for family in candidate_families():
            try:
                path = manager.findfont(font_manager.FontProperties(family=[family]), fallback_to_default=False)
            except ValueError:
                continue
            missing = _glyphs(path)
            if missing is None:
                continue
            for i, chars in enumerate(lacking):
                if chars and len(left := missing("".join(sorted(chars)))) < len(chars):
                    families[i].append(family)
                    lacking[i] = left
            if not any(lacking):
                break
    shaped = matplotlib_shapes_text() or not any(needs_shaping(name) for name in names)
    return LabelFonts(None if any(lacking) else tuple(tuple(f) for f in families), shaped)


def set_families(texts, families: Sequence[tuple[str, ...]]) -> None:
    """Draw ``texts[i]`` in ``families[i]`` (font family names) followed by matplotlib's default
    families, which draw the characters those fonts lack; an empty tuple keeps the default."""
    import matplotlib

    for text, extra in zip(texts, families):
        if extra:
            text.set_fontfamily([*extra, *matplotlib.rcParams["font.family"]])

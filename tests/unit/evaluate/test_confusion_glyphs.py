"""Class names the default font cannot draw (Bengali, CJK…) in reports/confusion.png: drawn in a
candidate font that has their glyphs (pipeline.evaluate.fonts: those pinned with the code), or
replaced by class indices, never as boxes with matplotlib's "Glyph … missing from font(s)" warnings,
and never in a font only this host has.

Fonts with known glyphs are built here with fontTools (a box for each character) in a directory
added to the candidates for one test; the other cases have matplotlib's own fonts only."""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib
import pytest
from fontTools.fontBuilder import FontBuilder
from fontTools.pens.ttGlyphPen import TTGlyphPen
from matplotlib import font_manager
from PIL import Image

from pipeline.evaluate import fonts as fonts_module
from pipeline.evaluate.fonts import LabelFonts, candidate_families, label_fonts, needs_shaping
from pipeline.evaluate.report import confusion_figure, plot_confusion, save_figure

BENGALI = ["ইতিবাচক", "নেতিবাচক"]
CJK = ["正面", "负面"]
LATIN = ["négatif", "positif"]
CM = [[5, 1], [2, 7]]
MPL_DATA = Path(matplotlib.get_data_path()).resolve()


def box_font(path: Path, family: str, chars: str) -> Path:
    """A TrueType font ``family`` with a glyph (a box) for each of ``chars`` and nothing else."""
    codepoints = sorted({ord(c) for c in chars})
    glyphs = [".notdef"] + [f"uni{cp:04X}" for cp in codepoints]
    pen = TTGlyphPen(None)
    pen.moveTo((100, 0))
    pen.lineTo((100, 700))
    pen.lineTo((500, 700))
    pen.lineTo((500, 0))
    pen.closePath()
    box = pen.glyph()
    fb = FontBuilder(1000, isTTF=True)
    fb.setupGlyphOrder(glyphs)
    fb.setupCharacterMap({cp: f"uni{cp:04X}" for cp in codepoints})
    fb.setupGlyf({g: box for g in glyphs})
    fb.setupHorizontalMetrics({g: (600, 100) for g in glyphs})
    fb.setupHorizontalHeader(ascent=800, descent=-200)
    fb.setupNameTable({"familyName": family, "styleName": "Regular"})
    fb.setupOS2(sTypoAscender=800, sTypoDescender=-200, usWinAscent=800, usWinDescent=200)
    fb.setupPost()
    fb.save(str(path))
    return path


@pytest.fixture
def add_font(tmp_path, monkeypatch):
    """``add_font(family, chars)``: a :func:`box_font` in a directory that is a font candidate for
    this test only (its family name is unique to the test)."""
    monkeypatch.setattr(font_manager.fontManager, "ttflist", list(font_manager.fontManager.ttflist))
    fonts = tmp_path / "fonts"
    fonts.mkdir()
    monkeypatch.setattr(fonts_module, "FONT_DIRS", (*fonts_module.FONT_DIRS, lambda: fonts.resolve()))

    def add(family: str, chars: str) -> str:
        family = f"{family} {tmp_path.name}"
        box_font(fonts / f"{family.replace(' ', '_')}.ttf", family, chars)
        return family

    return add


@pytest.fixture
def glyph_complaints(recwarn, caplog):
    """The warnings and matplotlib log records of WARNING or above seen so far (missing glyphs are
    warnings in matplotlib 3.6+, log records before; font look-ups log failures)."""
    caplog.set_level(logging.WARNING)

    def seen() -> list[str]:
        return [str(w.message) for w in recwarn if "glyph" in str(w.message).lower()] + [
            r.getMessage() for r in caplog.records if r.name.startswith("matplotlib") and r.levelno >= logging.WARNING
        ]

    return seen


def ticks(fig) -> tuple[list[str], list[str]]:
    ax = fig.axes[0]
    return [t.get_text() for t in ax.get_xticklabels()], [t.get_text() for t in ax.get_yticklabels()]


def description(png: Path) -> str | None:
    with Image.open(png) as image:
        image.load()
        return image.text.get("Description")


def test_bengali_labels_without_a_font_get_index_ticks_and_no_glyph_warning(tmp_path, glyph_complaints):
    fig = confusion_figure(CM, BENGALI)
    save_figure(fig, tmp_path / "figure.png")
    assert ticks(fig) == (["0", "1"], ["0", "1"])
    assert "evaluation report" in fig.axes[0].get_xlabel()
    assert all(a.get_legend() is None for a in fig.axes)  # no font draws the names: no key with them
    png = plot_confusion(tmp_path / "confusion.png", CM, BENGALI)
    assert description(png) == "0 = ইতিবাচক\n1 = নেতিবাচক"  # the mapping travels with the PNG
    assert glyph_complaints() == []


def test_bengali_labels_with_a_covering_font_are_named_on_the_ticks(tmp_path, add_font, glyph_complaints):
    family = add_font("Test Bengali", "".join(BENGALI))
    fonts = label_fonts(BENGALI)
    assert fonts == LabelFonts(families=((family,), (family,)), shaped=True)  # matplotlib 3.11+ shapes
    fig = confusion_figure(CM, BENGALI, fonts=fonts)
    save_figure(fig, tmp_path / "figure.png")
    assert ticks(fig) == (BENGALI, BENGALI)
    for text in fig.axes[0].get_xticklabels() + fig.axes[0].get_yticklabels():
        assert text.get_fontfamily() == [family, *matplotlib.rcParams["font.family"]]
    assert description(plot_confusion(tmp_path / "confusion.png", CM, BENGALI)) is None
    assert glyph_complaints() == []


def test_without_text_shaping_bengali_classes_are_named_in_a_key(tmp_path, add_font, monkeypatch, glyph_complaints):
    """matplotlib before 3.11 draws Bengali unshaped: indices on the ticks, the names once in a key."""
    monkeypatch.setattr(fonts_module, "matplotlib_shapes_text", lambda: False)
    family = add_font("Test Bengali", "".join(BENGALI))
    fonts = label_fonts(BENGALI)
    assert not fonts.on_ticks and fonts.families == ((family,), (family,))
    fig = confusion_figure(CM, BENGALI, fonts=fonts)
    save_figure(fig, tmp_path / "figure.png")
    assert ticks(fig) == (["0", "1"], ["0", "1"])
    (legend,) = [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    assert [t.get_text() for t in legend.get_texts()] == ["0 = ইতিবাচক", "1 = নেতিবাচক"]
    assert all(t.get_fontfamily()[0] == family for t in legend.get_texts())
    assert description(plot_confusion(tmp_path / "confusion.png", CM, BENGALI)) == "0 = ইতিবাচক\n1 = নেতিবাচক"
    assert glyph_complaints() == []


def test_latin_labels_stay_on_the_ticks_in_the_default_font(tmp_path, glyph_complaints):
    fonts = label_fonts(LATIN)
    assert fonts == LabelFonts(families=((), ()), shaped=True)
    fig = confusion_figure(CM, LATIN)
    save_figure(fig, tmp_path / "figure.png")
    assert ticks(fig) == (LATIN, LATIN)
    assert fig.axes[0].get_xlabel() == "predicted" and fig.axes[0].get_ylabel() == "actual"
    assert all(t.get_fontfamily() == matplotlib.rcParams["font.family"] for t in fig.axes[0].get_xticklabels())
    png = plot_confusion(tmp_path / "confusion.png", CM, LATIN)
    assert description(png) is None
    assert glyph_complaints() == []


@pytest.mark.parametrize("with_font", [True, False], ids=["cjk-font", "no-cjk-font"])
def test_cjk_labels_follow_the_candidate_fonts(tmp_path, with_font, request, glyph_complaints):
    if with_font:
        family = request.getfixturevalue("add_font")("Test CJK", "".join(CJK))
    fig = confusion_figure(CM, CJK)
    save_figure(fig, tmp_path / "figure.png")
    if with_font:
        assert ticks(fig) == (CJK, CJK)
        assert fig.axes[0].get_xticklabels()[0].get_fontfamily()[0] == family
    else:
        assert ticks(fig) == (["0", "1"], ["0", "1"])
    assert glyph_complaints() == []


def test_a_font_only_this_host_has_is_not_used(tmp_path, monkeypatch, glyph_complaints):
    """A font the host has (known to matplotlib's font manager, outside the candidate directories)
    that covers the names changes nothing: the PNG is the same as without it."""
    without = plot_confusion(tmp_path / "a.png", CM, CJK).read_bytes()
    monkeypatch.setattr(font_manager.fontManager, "ttflist", list(font_manager.fontManager.ttflist))
    host = box_font(tmp_path / "host.ttf", f"Host CJK {tmp_path.name}", "".join(CJK))
    font_manager.fontManager.addfont(str(host))
    fig = confusion_figure(CM, CJK)
    assert ticks(fig) == (["0", "1"], ["0", "1"])
    assert plot_confusion(tmp_path / "b.png", CM, CJK).read_bytes() == without
    assert glyph_complaints() == []


def test_each_name_gets_the_fonts_its_characters_need(add_font):
    bengali = add_font("Test Bengali", "".join(BENGALI))
    cjk = add_font("Test CJK", "".join(CJK))
    fonts = label_fonts(["positive", BENGALI[0], CJK[0], f"{BENGALI[0]} {CJK[0]}"])
    assert fonts.families == ((), (bengali,), (cjk,), tuple(sorted([bengali, cjk])))


def test_a_name_no_font_covers_leaves_no_fonts(add_font):
    assert label_fonts(["positive", BENGALI[0]]) == LabelFonts(families=None, shaped=True)


def test_the_same_labels_and_fonts_give_the_same_png(tmp_path, add_font):
    for labels in (LATIN, BENGALI):
        first = plot_confusion(tmp_path / "a.png", CM, labels).read_bytes()
        assert plot_confusion(tmp_path / "b.png", CM, labels).read_bytes() == first
    add_font("Test Bengali", "".join(BENGALI))
    first = plot_confusion(tmp_path / "a.png", CM, BENGALI).read_bytes()
    assert plot_confusion(tmp_path / "b.png", CM, BENGALI).read_bytes() == first


@pytest.mark.parametrize(
    "text, shaped",
    [
        ("ইতিবাচক", True),  # Bengali: the vowel sign ি is drawn before its consonant
        ("सकारात्मक", True),  # Devanagari conjuncts
        ("إيجابي", True),  # Arabic: right to left, joined
        ("חיובי", True),  # Hebrew: right to left
        ("บวก", True),  # Thai
        ("e\u0301", True),  # a combining accent
        ("négatif", False),  # precomposed é
        ("положительный", False),
        ("正面", False),
        ("긍정", False),  # precomposed Hangul syllables
    ],
)
def test_needs_shaping(text, shaped):
    assert needs_shaping(text) is shaped


def test_last_resort_font_is_never_a_candidate():
    """matplotlib's Last Resort font maps every code point to a placeholder box: it 'covers' any
    label and must not count."""
    assert not [f for f in candidate_families() if f.startswith("Last Resort")]

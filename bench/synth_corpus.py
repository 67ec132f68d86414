"""A synthetic WikiExtractor corpus whose vocabulary grows as real text does (Zipf, Heaps), at
any size, fast: ``write_corpus(out_dir, total_bytes)`` writes ``AA/wiki_00`` … files of about
64 MiB that ``download.local.format: auto`` (or ``wikiextractor``) reads.

Words. Word types come from a Pitman–Yor process (the two-parameter Chinese restaurant process,
discount ``d``, concentration ``theta``): the next token is a new type with probability
``(theta + d·K) / (theta + n)`` after ``n`` tokens of ``K`` types, else an existing type ``k``
with probability proportional to ``count_k − d``. Frequencies then follow Zipf's law (rank-
frequency slope about −0.9 over the top 1000 types, −1/d further down) and the number of
distinct words Heaps' law ``E[K_n] ≈ theta^(1−d) / d · n^d``. The defaults (d = 0.7,
theta = 230) give about 0.76 M distinct words at 0.1 GB (15 M tokens) and 6 M at 2 GB.

The process is simulated in blocks of tokens (at most 1/32 of the tokens so far, at most 2^21),
vectorised with numpy, not token by token: within a block the new-type probability is taken at
the block's midpoint, existing types are drawn from the counts at the block's start, and a
type first seen in a block is not reused inside it. Because a block is small next to ``n`` the
error is small: distinct-word counts match the exact expectation within a few per cent (tested).

Spelling. Type ``i`` (types are numbered in order of first use, so low numbers are frequent)
is spelled with syllables, as a number in bijective base 256, least significant first: the 256
first types are one syllable (2–4 letters, shortest first), the next 65 536 two, then three, so
words grow from 2 to about 12 letters with rank and share prefixes and endings that WordPiece
finds. A word's last syllable comes from 256 closed ones (onset, vowel, coda: "tan", "pu"), the
others from 256 open ones ("ba", "stea"), so no two types are spelled alike.
Every 37th type is a number and about 1 type in 12 is capitalised (a name); a sentence's first
word is capitalised. No one-syllable word is an abbreviation of ``pipeline.data.sentences``, so
every "." ends a sentence for the splitter.

Layout. Sentences of 8–40 words end with "." (7 % of the other words get a ","), paragraphs of
2–8 sentences are lines, articles have a lognormal number of sentences (mean ~3 KB, many short,
few long) and a unique title (two or three capitalised frequent words, numbered by the
document id), so the clean stage's de-duplication keeps every article.

The same seed gives the same bytes.

    python bench/synth_corpus.py OUT_DIR --gb 0.1 [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.data.sentences import ABBREVIATIONS  # noqa: E402

DISCOUNT = 0.7
CONCENTRATION = 230.0
FILE_BYTES = 64 << 20
MAX_BLOCK = 1 << 21
SYLLABLES = 256
NUMBER_EVERY = 37  # type i is a number iff i % 37 == 5 (and i >= 37)
TITLE_WORDS = 512  # titles are spelled with the 512 first types
SENTENCE_WORDS = (8, 40)
PARAGRAPH_SENTENCES = (2, 8)
COMMA_RATE = 0.07
ARTICLE_SENTENCES_MU, ARTICLE_SENTENCES_SIGMA = 2.45, 1.0  # lognormal: mean ~19 sentences (~3 KB)
MEAN_ARTICLE_BYTES = 3100  # (plans how many articles to lay out at once)
ROW = 16  # bytes per word row: a word of up to 14 letters and its suffix (" ", ", ", ". ", ".\n")
_SUFFIX_FIRST = np.frombuffer(b" ,..", np.uint8)  # suffix codes 0..3: " ", ", ", ". ", ".\n"
_SUFFIX_SECOND = np.frombuffer(b"  \n", np.uint8)[[0, 0, 1, 2]]


def expected_types(n: float, discount: float = DISCOUNT, concentration: float = CONCENTRATION) -> float:
    """E[K_n], the expected number of distinct types after ``n`` tokens of the Pitman–Yor process."""
    d, th = discount, concentration
    log_ratio = math.lgamma(th + d + n) + math.lgamma(th) - math.lgamma(th + d) - math.lgamma(th + n)
    return th / d * (math.exp(log_ratio) - 1.0)


class PitmanYor:
    """Token type ids of a Pitman–Yor process, drawn in blocks (see the module docstring)."""

    def __init__(self, rng: np.random.Generator, discount: float = DISCOUNT, concentration: float = CONCENTRATION):
        if not 0.0 <= discount < 1.0 or concentration <= -discount:
            raise ValueError(
                f"Pitman-Yor needs 0 <= discount < 1 and concentration > -discount, not {discount}, {concentration}"
            )
        self.rng, self.d, self.theta = rng, discount, concentration
        self.weights = np.zeros(1 << 16)  # count - discount of each type
        self.types = 0
        self.tokens = 0

    def draw(self, size: int) -> np.ndarray:
        out = np.empty(size, np.int64)
        pos = 0
        while pos < size:
            block = 1 if self.tokens == 0 else min(size - pos, max(16, min(MAX_BLOCK, self.tokens // 32)))
            out[pos : pos + block] = self._block(block)
            pos += block
        return out

    def _block(self, b: int) -> np.ndarray:
        d, th, k, n, rng = self.d, self.theta, self.types, self.tokens, self.rng
        p_start = (th + d * k) / (th + n)
        p = min(1.0, (th + d * (k + b * p_start / 2)) / (th + n + b / 2))  # at the block's midpoint
        new = rng.random(b) < p
        if k == 0:
            new[0] = True
        m = int(np.count_nonzero(new))
        ids = np.empty(b, np.int64)
        ids[new] = np.arange(k, k + m)
        r = b - m
        if r:
            cum = np.cumsum(self.weights[:k])
            u = np.cumsum(rng.standard_exponential(r + 1))  # sorted uniforms (order statistics)
            old = np.searchsorted(cum, u[:-1] * (cum[-1] / u[-1]), side="right")
            np.minimum(old, k - 1, out=old)
            firsts = np.flatnonzero(np.diff(old, prepend=-1))
            self.weights[old[firsts]] += np.diff(np.append(firsts, r))
            rng.shuffle(old)
            ids[~new] = old
        if k + m > len(self.weights):
            self.weights = np.concatenate([self.weights, np.zeros(max(len(self.weights), m))])
        self.weights[k : k + m] = 1.0 - d
        self.types, self.tokens = k + m, n + b
        return ids


def _syllables(coda: bool) -> list[bytes]:
    """256 syllables of at most 4 letters, shortest first: a consonant onset and a vowel, and with
    ``coda`` optional closing consonants (a word's last syllable: none is an abbreviation of the
    sentence splitter). A word's syllables then split at its vowel runs in one way only, so
    different syllable sequences spell different words."""
    rng = np.random.default_rng(12345 + coda)  # the spelling is the same for every seed
    parts = (
        ("b c d f g h j k l m n p r s t v w y z".split(), "bl br ch cl cr dr fl fr gr pl pr sh st th tr".split(), 0.2),
        ("a e i o u".split(), "ea ai ou io".split(), 0.1),
        (["", "", "n", "r", "s", "l", "t", "m"] if coda else [""], "nd st ng rt".split() if coda else [""], 0.1),
    )
    banned = ABBREVIATIONS | {"no", "nos"}
    out: set[str] = set()
    while len(out) < SYLLABLES:
        s = "".join(str(rng.choice(long if rng.random() < p_long else short)) for short, long, p_long in parts)
        if len(s) <= 4 and s not in banned:
            out.add(s)
    ordered = sorted(out)
    rng.shuffle(ordered)
    return [s.encode() for s in sorted(ordered, key=len)]


def _gather(pool: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``pool[starts[i] : starts[i] + lengths[i]]`` for every ``i``, concatenated."""
    ends = np.cumsum(lengths)
    if not len(ends) or not ends[-1]:
        return np.empty(0, np.uint8)
    idx = np.repeat(starts - (ends - lengths), lengths)
    idx += np.arange(ends[-1], dtype=idx.dtype)
    return pool[idx]


class Spelling:
    """Every type seen so far as a fixed-width row of bytes (the word, zero padded) and its length."""

    def __init__(self):
        # pieces: 256 closed syllables (a word's last), 256 open ones (the others), the 10 digits
        pieces = _syllables(coda=True) + _syllables(coda=False) + [str(i).encode() for i in range(10)]
        self.piece_len = np.array([len(p) for p in pieces], np.int64)
        self.piece_start = np.cumsum(self.piece_len) - self.piece_len
        self.piece_pool = np.frombuffer(b"".join(pieces), np.uint8)
        # positions 1 and 2 of a word use their own order of the alphabets; positions 0 and 3 keep
        # them shortest first (a 4-syllable word, past 16.8 M types, has at most 14 letters)
        perm = np.random.default_rng(54321).permuted(np.tile(np.arange(SYLLABLES), (4, 1)), axis=1)
        perm[0] = perm[3] = np.arange(SYLLABLES)
        self.perm = perm
        self.rows = np.zeros((0, ROW), np.uint8)
        self.length = np.zeros(0, np.uint8)

    def extend(self, upto: int) -> None:
        """Spell the types ``len(self.length)`` … ``upto - 1``."""
        first = len(self.length)
        if upto <= first:
            return
        ids = np.arange(first, upto, dtype=np.int64)
        pieces = np.full((len(ids), 8), -1, np.int64)
        # letters: bijective base 256, least significant syllable first
        x = ids.copy()
        width = np.ones(len(ids), np.int64)
        for w in (2, 3, 4):
            block = SYLLABLES ** (w - 1)
            more = x >= block
            x[more] -= block
            width[more] = w
        for j in range(4):
            syllable = self.perm[j][x % SYLLABLES] + np.where(j == width - 1, 0, SYLLABLES)
            pieces[:, j] = np.where(j < width, syllable, -1)
            x //= SYLLABLES
        # numbers: the decimal digits of i // 37, most significant first
        number = (ids % NUMBER_EVERY == 5) & (ids >= NUMBER_EVERY)
        value = ids[number] // NUMBER_EVERY
        ndig = 1 + sum((value >= 10**j).astype(np.int64) for j in range(1, 8))
        numpieces = np.full((len(value), 8), -1, np.int64)
        for j in range(8):
            power = 10 ** np.maximum(ndig - 1 - j, 0)
            numpieces[:, j] = np.where(j < ndig, 2 * SYLLABLES + (value // power) % 10, -1)
        pieces[number] = numpieces
        flat = pieces[pieces >= 0]
        word_bytes = _gather(self.piece_pool, self.piece_start[flat], self.piece_len[flat])
        lengths = np.where(pieces >= 0, self.piece_len[np.maximum(pieces, 0)], 0).sum(axis=1)
        if lengths.max() > ROW - 2:
            raise ValueError(f"synth_corpus: a word of {lengths.max()} letters does not fit a row of {ROW} bytes")
        rows = np.full((len(ids), ROW), ord(" "), np.uint8)  # the word, then the usual suffix " "
        rows[np.arange(ROW) < lengths[:, None]] = word_bytes
        # names: about 1 type in 12 beyond the 300 first is capitalised
        name = ((ids * 2654435761) % (1 << 32) >> 20) % 12 == 0
        rows[name & (ids >= 300) & ~number, 0] -= 32
        self.rows = np.concatenate([self.rows, rows])
        self.length = np.concatenate([self.length, (lengths + 1).astype(np.uint8)])

    def word(self, i: int) -> str:
        return self.rows[i, : self.length[i] - 1].tobytes().decode()


def _render(spell: Spelling, ids: np.ndarray, suffix: np.ndarray, capital: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Text bytes of the tokens (each word then its suffix: code 0 " ", 1 ", ", 2 ". ", 3 ".\\n")
    and each token's length in them."""
    n = len(ids)
    rows = spell.rows.view(np.dtype((np.void, ROW))).ravel()[ids].view(np.uint8).reshape(n, ROW)
    length = spell.length[ids]  # the word and a space
    marked = np.flatnonzero(suffix)
    end = length[marked].astype(np.int64) - 1
    rows[marked, end] = _SUFFIX_FIRST[suffix[marked]]
    rows[marked, end + 1] = _SUFFIX_SECOND[suffix[marked]]
    length[marked] += 1
    first = rows[capital, 0]
    rows[capital, 0] = np.where((first >= ord("a")) & (first <= ord("z")), first - 32, first)
    return rows[np.arange(ROW, dtype=np.uint8) < length[:, None]], length


class _Files:
    """WikiExtractor's file names, AA/wiki_00 … AA/wiki_99, AB/wiki_00 …, each closed after the
    article that brings it to ``file_bytes``."""

    def __init__(self, out_dir: Path, file_bytes: int):
        self.out_dir, self.file_bytes = Path(out_dir), file_bytes
        self.count, self.size, self.f = 0, 0, None

    def write(self, parts: list, size: int) -> None:
        if self.f is None:
            d = self.count // 100
            path = self.out_dir / f"{chr(65 + d // 26)}{chr(65 + d % 26)}" / f"wiki_{self.count % 100:02d}"
            path.parent.mkdir(parents=True, exist_ok=True)
            self.f = open(path, "wb")
            self.count += 1
        self.f.write(b"".join(parts))
        self.size += size
        if self.size >= self.file_bytes:
            self.close()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f, self.size = None, 0


def _layout(rng: np.random.Generator, articles: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sentences per article (lognormal), words per sentence and whether a sentence ends its
    paragraph (paragraphs of 2–8 sentences, cut short where the article ends)."""
    n_sent = np.maximum(1, np.rint(rng.lognormal(ARTICLE_SENTENCES_MU, ARTICLE_SENTENCES_SIGMA, articles)))
    n_sent = n_sent.astype(np.int64)
    sentences = int(n_sent.sum())
    sent_len = rng.integers(SENTENCE_WORDS[0], SENTENCE_WORDS[1] + 1, sentences)
    para_end = np.zeros(sentences, bool)
    ends = np.cumsum(rng.integers(PARAGRAPH_SENTENCES[0], PARAGRAPH_SENTENCES[1] + 1, sentences // 2 + 1)) - 1
    para_end[ends[ends < sentences]] = True
    para_end[np.cumsum(n_sent) - 1] = True
    return n_sent, sent_len, para_end


def write_corpus(
    out_dir: Path,
    total_bytes: int,
    *,
    seed: int = 0,
    discount: float = DISCOUNT,
    concentration: float = CONCENTRATION,
    file_bytes: int = FILE_BYTES,
) -> dict:
    """Write about ``total_bytes`` (whole articles, stopping after the one that reaches it) of
    WikiExtractor files under ``out_dir``; return {bytes, documents, tokens, distinct_words,
    files, expected_distinct_words}. ``tokens`` counts the words of the title lines and bodies."""
    rng = np.random.default_rng(seed)
    py = PitmanYor(rng, discount, concentration)
    spell = Spelling()
    files = _Files(out_dir, file_bytes)
    titles: list[str] = []
    written = documents = tokens = max_type = 0
    try:
        while written < total_bytes:
            articles = int(min(4096, max(64, (total_bytes - written) / MEAN_ARTICLE_BYTES * 1.1 + 8)))
            n_sent, sent_len, para_end = _layout(rng, articles)
            n_tok = int(sent_len.sum())
            ids = py.draw(n_tok)
            spell.extend(py.types)
            if not titles:  # two or three words from the 512 first types, numbered by the document id
                titles = [w[:1].upper() + w[1:] for w in map(spell.word, range(TITLE_WORDS))]
            sent_last = np.cumsum(sent_len) - 1
            suffix = (rng.random(n_tok) < COMMA_RATE).astype(np.int64)
            suffix[sent_last] = np.where(para_end, 3, 2)
            capital = np.zeros(n_tok, bool)
            capital[sent_last - sent_len + 1] = True
            text, token_len = _render(spell, ids, suffix, capital)
            art_tokens = np.add.reduceat(sent_len, np.cumsum(n_sent) - n_sent)
            art_first = np.cumsum(art_tokens) - art_tokens
            art_start = np.append(0, np.cumsum(np.add.reduceat(token_len, art_first, dtype=np.int64))).tolist()
            art_tokens = art_tokens.tolist()
            view = memoryview(text)
            parts: list = []
            size = 0
            for a in range(articles):
                documents += 1
                d = documents
                title = f"{titles[d % TITLE_WORDS]} {titles[d // TITLE_WORDS % TITLE_WORDS]}"
                if d >= TITLE_WORDS**2:
                    title += f" {titles[d // TITLE_WORDS**2 % TITLE_WORDS]}"
                head = f'<doc id="{d}" url="https://en.wikipedia.org/wiki?curid={d}" title="{title}">\n{title}\n\n'.encode()
                parts += (head, view[art_start[a] : art_start[a + 1]], b"\n</doc>\n")
                size += len(head) + art_start[a + 1] - art_start[a] + 8
                tokens += art_tokens[a] + title.count(" ") + 1
                if written + size >= total_bytes or files.size + size >= file_bytes:
                    files.write(parts, size)
                    written += size
                    parts, size = [], 0
                    if written >= total_bytes:
                        max_type = max(max_type, int(ids[: art_first[a] + art_tokens[a]].max()))
                        break
            else:
                if parts:
                    files.write(parts, size)
                    written += size
                max_type = max(max_type, int(ids.max()))
    finally:
        files.close()
    return {
        "bytes": written,
        "documents": documents,
        "tokens": tokens,
        "distinct_words": max(max_type + 1, TITLE_WORDS),
        "files": files.count,
        "expected_distinct_words": round(expected_types(tokens, discount, concentration)),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--gb", type=float, default=0.1, help="size in GB (1e9 bytes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--discount", type=float, default=DISCOUNT)
    p.add_argument("--concentration", type=float, default=CONCENTRATION)
    p.add_argument("--clear", action="store_true", help="delete OUT_DIR first")
    args = p.parse_args(argv)
    if args.clear:
        shutil.rmtree(args.out_dir, ignore_errors=True)
    t0, c0 = time.perf_counter(), time.process_time()
    stats = write_corpus(
        args.out_dir,
        int(args.gb * 1e9),
        seed=args.seed,
        discount=args.discount,
        concentration=args.concentration,
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats.update(wall_s=round(wall, 2), cpu_s=round(cpu, 2), mb_per_s=round(stats["bytes"] / 1e6 / wall, 1))
    stats["mb_per_cpu_s"] = round(stats["bytes"] / 1e6 / cpu, 1)
    print(
        f"{stats['bytes']:,} bytes in {stats['files']} files, {stats['documents']:,} documents, "
        f"{stats['tokens']:,} tokens, {stats['distinct_words']:,} distinct words "
        f"(expected {stats['expected_distinct_words']:,}); {stats['mb_per_s']} MB/s "
        f"({stats['mb_per_cpu_s']} MB per CPU s)"
    )
    return stats


if __name__ == "__main__":
    main()

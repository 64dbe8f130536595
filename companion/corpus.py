"""The committed text corpus of every real-model experiment: ``companion/data/corpus/`` (sources in
its ``SOURCES.md``), or the ``*.txt`` files of the folder ``$COMPANION_DATA`` when set."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

from companion._aliases import renamed_getattr as _renamed_getattr
from companion._paths import DISTRIBUTION, package_data

__all__ = ["load_corpus", "corpus_sentences"]
__getattr__ = _renamed_getattr(__name__)  # 0.1 names made private (companion._aliases)


def _corpus_dir() -> Path:
    """Folder of the corpus: ``$COMPANION_DATA`` if set, else ``companion/data/corpus``; it must exist."""
    env = os.environ.get("COMPANION_DATA")
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise ValueError(f"corpus folder {path} (COMPANION_DATA) does not exist; point COMPANION_DATA "
                             "at a folder of .txt files, or unset it to use the corpus installed with "
                             "the package")
        return path
    path = package_data("corpus")
    if not path.is_dir():
        raise ValueError(f"corpus folder {path} does not exist: the package was installed without its data; "
                         f"reinstall it (pip install --force-reinstall {DISTRIBUTION}) or set COMPANION_DATA "
                         "to a folder of .txt files")
    return path


def _corpus_files() -> list[Path]:
    """The sorted ``*.txt`` files of ``_corpus_dir()``; ValueError if there is none."""
    files = sorted(_corpus_dir().glob("*.txt"))
    if not files:
        raise ValueError(f"no .txt files in {_corpus_dir()}; the corpus is listed in "
                         "companion/data/corpus/SOURCES.md")
    return files


def load_corpus(min_chars: int = 40, max_paragraphs: int | None = None) -> list[str]:
    """Return the paragraphs of the corpus, whitespace-normalised, in file order.

    Parameters
    ----------
    min_chars : int, default 40
        Paragraphs shorter than this (headings, chapter numbers) are dropped.
    max_paragraphs : int or None
        Keep only the first ``max_paragraphs`` paragraphs (None: all).

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        If ``min_chars`` < 0 or ``max_paragraphs`` < 1.
    """
    if not isinstance(min_chars, int) or min_chars < 0:
        raise ValueError(f"min_chars must be a non-negative integer, got {min_chars!r}")
    if max_paragraphs is not None and (not isinstance(max_paragraphs, int) or max_paragraphs < 1):
        raise ValueError(f"max_paragraphs must be a positive integer or None, got {max_paragraphs!r}")
    return _corpus_paragraphs(min_chars)[:max_paragraphs]


def _corpus_paragraphs(min_chars: int) -> list[str]:
    """Whitespace-normalised paragraphs of every corpus file with ``>= min_chars`` characters."""
    texts = (f.read_text(encoding="utf-8").replace("\r\n", "\n") for f in _corpus_files())
    paragraphs = (" ".join(p.split()) for text in texts for p in re.split(r"\n\s*\n", text) if p.strip())
    return [p for p in paragraphs if len(p) >= min_chars]


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)]*\s+(?=[A-Z\"'“‘(])")


def corpus_sentences(n: int | None = None, min_words: int = 6, max_words: int = 40) -> list[str]:
    """Return the sentences of the corpus with ``min_words`` ≤ word count ≤ ``max_words``, in order.

    Parameters
    ----------
    n : int or None
        Return only the first ``n`` sentences.
    min_words, max_words : int
        Word-count window (inclusive).

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        If the window is empty or ``n`` < 1, or the corpus has fewer than ``n`` such sentences.
    """
    if min_words < 1 or max_words < min_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"n must be a positive integer or None, got {n!r}")
    sentences = (s.strip() for para in _corpus_paragraphs(0) for s in _SENTENCE_END.split(para))
    out = list(itertools.islice((s for s in sentences if min_words <= len(s.split()) <= max_words), n))
    if n is not None and len(out) < n:
        raise ValueError(f"the corpus has only {len(out)} sentences of {min_words}-{max_words} words, "
                         f"not {n}")
    return out

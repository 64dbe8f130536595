import os

import numpy as np
import pytest
import torch

import companion
from companion.corpus import _corpus_files, corpus_sentences, load_corpus


def test_setup_notebook_is_deterministic_and_sets_environment():
    a = companion.setup_notebook(seed=3).standard_normal(5)
    t1 = torch.randn(3)
    b = companion.setup_notebook(seed=3).standard_normal(5)
    t2 = torch.randn(3)
    np.testing.assert_array_equal(a, b)
    assert torch.equal(t1, t2)
    assert os.environ["TQDM_DISABLE"] == "1" and os.environ["HF_HUB_OFFLINE"] == "1"
    assert torch.get_num_threads() == companion.notebook.NOTEBOOK_THREADS
    assert torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"seed": -1}, ValueError, "seed must be >= 0"),
        ({"seed": 1.5}, TypeError, "seed must be an integer"),
        ({"seed": True}, TypeError, "seed must be an integer"),
        ({"threads": 0}, ValueError, "threads must be >= 1"),
        ({"threads": "2"}, TypeError, "threads must be an integer"),
    ],
)
def test_setup_notebook_rejects_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        companion.setup_notebook(**kwargs)


def test_corpus_is_present_and_clean():
    assert len(_corpus_files()) >= 1
    paragraphs = load_corpus()
    assert sum(len(p) for p in paragraphs) > 300_000
    assert all("\n" not in p and len(p) >= 40 for p in paragraphs)
    sentences = corpus_sentences(100, min_words=6, max_words=40)
    assert len(sentences) == 100
    assert all(6 <= len(s.split()) <= 40 for s in sentences)
    assert load_corpus(max_paragraphs=7) == paragraphs[:7]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: load_corpus(min_chars=-1), "min_chars"),
        (lambda: load_corpus(max_paragraphs=0), "max_paragraphs"),
        (lambda: corpus_sentences(0), "n must be"),
        (lambda: corpus_sentences(5, min_words=10, max_words=3), "min_words"),
        (lambda: corpus_sentences(10**7), "only"),
    ],
)
def test_corpus_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_corpus_dir_override(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("First paragraph that is long enough to keep around.\n\nshort\n")
    monkeypatch.setenv("COMPANION_DATA", str(tmp_path))
    assert load_corpus() == ["First paragraph that is long enough to keep around."]
    monkeypatch.setenv("COMPANION_DATA", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="does not exist"):
        load_corpus()

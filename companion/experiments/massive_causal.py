"""The ``massive_causal`` experiment: a causal map of the massive activations (issue 27).

Every arm is one run of the evaluation texts (pairs of corpus sentences joined by a line break) with
:class:`~companion.outliers.massive_activations.StreamEdit` interventions, a quantisation or zeroed
input features; the Result keeps each arm's per-text score, so the chapter forms paired differences
with bootstrap intervals over texts.  Score: next-token cross-entropy (nats) for a causal LM;
:math:`1 - \\cos` between the arm's and the untouched sentence embedding for an encoder (no
masked-token head ships with all-MiniLM-L6-v2).

Arms (those that apply to the model): ``none``; ``first_zero`` / ``first_mean`` (Sun et al.:
:math:`h_\\ell[0, c]` at ``first_layer`` set to 0 / its calibration mean); ``word_zero`` (the
channel at every occurrence of ``words`` at each layer of ``word_layers``); ``first_word_zero``
(both); ``attn_write_zero`` / ``mlp_write_zero`` (what block ``write_block``'s attention / MLP adds
to the channel, at every position); ``w8a8`` / ``w8a8_first_float`` (W8 per output row, A8
per-tensor static symmetric on every linear layer of the blocks, without / with the first token
kept in floating point, its range calibrated without it); ``features_zero`` (the LLM.int8()
outlier features zeroed at every normalised linear input), against ``n_random`` draws of as many
random channels on the first ``random_texts`` texts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from companion.experiments import check_result, register
from companion.experiments._common import check_counts, load_model

__all__ = ["MassiveCausalExperiment", "CPU_CONFIGS", "scores_of", "NORMALISED_INPUTS"]

#: The linear layers that read a block's normalised input (LLM.int8()'s hidden states).
NORMALISED_INPUTS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "query", "key", "value",
                     "intermediate.dense")


def _evaluation_texts(n: int, min_words: int, max_words: int) -> list[str]:
    """``n`` texts, each two consecutive corpus sentences joined by a line break."""
    from companion.corpus import corpus_sentences

    s = corpus_sentences(2 * n, min_words=min_words, max_words=max_words)
    return [s[2 * i] + "\n" + s[2 * i + 1] for i in range(n)]


def _block_linears(m) -> dict:
    import torch

    return {f"{l}.{n}": mod for l, b in enumerate(m.blocks) for n, mod in b.named_modules()
            if isinstance(mod, torch.nn.Linear)}


def _input_ranges(m, texts, modules, max_length, batch_size) -> tuple[dict, dict]:
    """Symmetric static ranges of every module's input: over all real tokens, and without position 0."""
    import torch

    from companion.transformers.hooks import hooks
    from companion.transformers.models import tokenize

    full = {n: 0.0 for n in modules}
    rest = dict(full)
    mask = [None]

    def make(name):
        def hook(_m, args):
            a = args[0].detach().abs().amax(-1)                      # [B, T]
            full[name] = max(full[name], float(a[mask[0]].max()))
            later = mask[0].clone()
            later[:, 0] = False
            rest[name] = max(rest[name], float(a[later].max()))
        return hook

    with hooks(pre=[(mod, make(n)) for n, mod in modules.items()]), torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tokenize(m, texts[start:start + batch_size], max_length)
            mask[0] = enc["attention_mask"].bool()
            kwargs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
            if m.kind == "causal-lm":
                kwargs["use_cache"] = False
            m.base(**kwargs)
    return ({n: (-r, r) for n, r in full.items()}, {n: (-r, r) for n, r in rest.items()})


@contextlib.contextmanager
def _w8a8(modules, ranges, first_float: bool):
    """W8 per row, A8 per-tensor static; with ``first_float`` position 0 of every input stays float."""
    from companion.applications.model_quantization import LinearQuantization, quantized_linears
    from companion.transformers.hooks import hooks

    spec = LinearQuantization(act_bits=8, act_granularity="tensor", static=True, weight_bits=8)
    saved = {}

    def save(name):
        def hook(_m, args):
            saved[name] = args[0][:, :1].clone()
        return hook

    def restore(name):
        def hook(_m, args):
            x = args[0].clone()
            x[:, :1] = saved[name].to(x.dtype)
            return (x,) + tuple(args[1:])
        return hook

    save_pre = [(mod, save(n)) for n, mod in modules.items()] if first_float else []
    restore_pre = [(mod, restore(n)) for n, mod in modules.items()] if first_float else []
    with hooks(pre=save_pre), quantized_linears(modules, spec, ranges=ranges), hooks(pre=restore_pre):
        yield None


@register("massive_causal", schema=1)
@dataclass(frozen=True)
class MassiveCausalExperiment:
    """Ablations, sublayer writes, quantisation and feature zeroing around a massive channel.

    Result arrays: ``score_<arm>`` ``[n_texts]`` and ``trace_<arm>`` ``[L, n_texts]`` (the channel at
    the first token after each block) per arm; ``random_score`` ``[n_random, random_texts]``,
    ``random_channels``; the token map of the untouched run (``map_ids``, ``map_mask``, ``map_value``,
    ``map_top_abs``, ``map_value_norm`` ``[L, n_texts, max_length]``, ``map_median_abs``); the
    LLM.int8() statistics on the calibration texts (``feature_share``, ``feature_max_abs`` ``[2L, d]``,
    ``features``); ``calibration_first`` ``[n_calibration]``.  Scalar ``arms``: the arms, comma-separated.
    """

    model: str = "smollm2-135m"  #: :func:`companion.transformers.models.load` name
    channel: int = 507  #: the massive channel
    first_layer: int = 3  #: residual layer of the first-token ablation
    words: tuple[str, ...] = (" the",)  #: words whose channel value is zeroed (each one token)
    word_layers: tuple[int, ...] = (3, 4, 5, 6, 7, 8, 9)  #: residual layers where they are zeroed
    write_block: int = 11  #: block whose attention and MLP writes to the channel are zeroed (-1: none)
    n_texts: int = 128
    n_calibration: int = 64  #: calibration texts (static ranges, the mean, the LLM.int8() criterion)
    n_random: int = 50  #: random channel draws
    random_texts: int = 16  #: texts of each random draw (the first ones)
    threshold: float = 6.0  #: LLM.int8()'s magnitude criterion
    min_words: int = 6
    max_words: int = 16
    max_length: int = 48
    batch_size: int = 16
    seed: int = 0
    dtype: str = "float32"

    def compute(self, device, progress):
        """Run every arm that applies; returns the Result's arrays and scalars."""
        from companion.applications.pruning import zero_linear_inputs
        from companion.outliers import massive_activations as ma
        from companion.outliers.outlier_features import outlier_feature_statistics

        check_counts(self, {"n_texts": 2, "n_calibration": 2, "n_random": 1, "random_texts": 2,
                            "max_length": 2, "batch_size": 1, "min_words": 1, "max_words": 1})
        if self.random_texts > self.n_texts:
            raise ValueError(f"random_texts ({self.random_texts}) must be <= n_texts ({self.n_texts})")
        m = load_model(self, device)
        texts = _evaluation_texts(self.n_texts + self.n_calibration, self.min_words, self.max_words)
        ev, cal = texts[:self.n_texts], texts[self.n_texts:]
        kw = dict(batch_size=self.batch_size, max_length=self.max_length)
        c = self.channel
        out, arms, base_emb = {}, [], None

        def arm(name, edits=(), ctx=None, texts_=ev):
            nonlocal base_emb
            with ctx if ctx is not None else contextlib.nullcontext():
                run = ma.edited_run(m, texts_, edits, trace_channel=c, **kw)
            if run.loss is not None:
                score = run.loss
            else:
                if name == "none":
                    base_emb = run.embedding
                score = 1.0 - (run.embedding * base_emb[:len(texts_)]).sum(-1)
            if texts_ is ev:
                out[f"score_{name}"], out[f"trace_{name}"] = score, run.trace.astype(np.float32)
                arms.append(name)
            return score

        tm = ma.token_map(m, ev, c, **kw)
        out.update(map_ids=tm.ids, map_mask=tm.mask, map_value=tm.value, map_top_abs=tm.top_abs,
                   map_value_norm=tm.value_norm, map_median_abs=tm.median_abs)
        arm("none")
        first = ma.edited_run(m, cal, (), trace_channel=c, **kw).trace[self.first_layer - 1]
        out["calibration_first"] = first
        one = ma.StreamEdit("residual", self.first_layer, c, "first", 0.0)
        arm("first_zero", [one])
        arm("first_mean", [ma.StreamEdit("residual", self.first_layer, c, "first", float(first.mean()))])
        if self.words:
            ids = []
            for w in self.words:
                tok = m.tokenizer(w, add_special_tokens=False)["input_ids"]
                if len(tok) != 1:
                    raise ValueError(f"words must be single tokens of {m.name}; {w!r} is {len(tok)}")
                ids += tok
            word = [ma.StreamEdit("residual", l, c, tuple(ids), 0.0) for l in self.word_layers]
            arm("word_zero", word)
            arm("first_word_zero", [one, *word])
        if self.write_block >= 0:
            arm("attn_write_zero", [ma.StreamEdit("attention", self.write_block, c, "all", 0.0)])
            arm("mlp_write_zero", [ma.StreamEdit("mlp", self.write_block, c, "all", 0.0)])
        linears = _block_linears(m)
        full, rest = _input_ranges(m, cal, linears, self.max_length, self.batch_size)
        arm("w8a8", ctx=_w8a8(linears, full, first_float=False))
        arm("w8a8_first_float", ctx=_w8a8(linears, rest, first_float=True))
        ofs = outlier_feature_statistics(m, cal, threshold=self.threshold, **kw)
        feats = ofs.systematic()
        out.update(feature_share=ofs.share, feature_max_abs=ofs.max_abs, features=feats.astype(np.int64))
        readers = {n: mod for n, mod in linears.items() if n.split(".", 1)[1].endswith(NORMALISED_INPUTS)}
        k = max(len(feats), 1)
        if len(feats):
            arm("features_zero", ctx=zero_linear_inputs(readers, {n: feats for n in readers}))
        rng = np.random.default_rng(self.seed)
        others = np.setdiff1d(np.arange(m.d_model), feats)
        if others.size < k:
            raise ValueError(f"{len(feats)} of {m.d_model} channels are outlier features; no random set of "
                             f"as many is left (raise threshold={self.threshold})")
        draws = np.stack([np.sort(rng.choice(others, size=k, replace=False)) for _ in range(self.n_random)])
        sub = ev[:self.random_texts]
        rand = [arm("random", ctx=zero_linear_inputs(readers, {n: d for n in readers}), texts_=sub)
                for d in draws]
        out.update(random_score=np.stack(rand), random_channels=draws)
        return {**out, "arms": ",".join(arms), "n_readers": len(readers), **m.facts()}


#: The CPU configurations of the chapter: SmolLM2 (defaults) and MiniLM ([CLS], channel 99).
CPU_CONFIGS = {
    "smollm2-135m": MassiveCausalExperiment(),
    "minilm-l6": MassiveCausalExperiment(model="minilm-l6", channel=99, first_layer=1, words=(),
                                         word_layers=(), write_block=-1),
}


def scores_of(result) -> dict:
    """The per-text score of every arm stored in a Result, ``{arm: [n_texts]}``.

    Parameters
    ----------
    result : Result

    Returns
    -------
    dict

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result; a missing array.
    """
    r = check_result(result, "massive_causal", ("score_none", "random_score"))
    arms = str(r.scalars["arms"]).split(",")
    missing = [a for a in arms if f"score_{a}" not in r.arrays]
    if missing:
        raise ValueError(f"the Result lacks the scores of arms {missing}; recompute it")
    return {a: r.arrays[f"score_{a}"] for a in arms}

"""Part III, outliers: per-channel statistics of real residual streams and what makes them large.

========================  ==================================================================
``channel_statistics``    per-layer, per-channel moments and exceedance counts, streamed over a corpus
``regimes``               predicted versus observed counts, tails, top activations
``attention_logits``      query/key capture and the statistics of q . k
``massive_activations``   the first-token massive activations and their ablation
``outlier_features``      LLM.int8()'s outlier features, per layer
========================  ==================================================================
"""

"""Part III, injection: what to inject, the one sweep engine, the metric vocabulary, attribution.

========================  ==================================================================
``directions``            concept and random directions, prompts, the stream's typical sizes
``engine``                ``sweep_injections`` (prefix replay), ``track_injection``, SweepResult
``metrics``               the metric vocabulary, next-token KL, linearised laws, windows
``attribution``           an injected direction's projection split over the sublayers
========================  ==================================================================
"""

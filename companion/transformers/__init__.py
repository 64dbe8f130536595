"""Real pretrained Transformers: load them, hook them, read and write their residual stream.

========================  ==================================================================
``models``                ``load`` a model by name (two offline, any hub id), ``wrap`` one you hold
``sources``               where the weights come from: offline packages, the checked cache, the hub
``hooks``                 the one way to attach PyTorch hooks (always removed)
``stream``                ``residual_stream``, ``inject``, and the engine's ModelAdapter
``readout``               logits from a residual (logit lens), next-token loss, sentence embeddings
========================  ==================================================================

No weight folding, no re-centring: the modules run as trained.
"""

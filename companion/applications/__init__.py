"""Part III, applications: quantisation, pruning and the training controls of the outlier note.

``quantization`` (fake quantisers, ranges, SmoothQuant), ``model_quantization`` (a model's linear layers
quantised; bias corrections), ``pruning`` (statistics of linear-layer inputs; pruning with or without mean
compensation) and ``training_controls`` (tail-bound gradient clipping, the mean-and-Frobenius regulariser).
"""

"""Part III, applications: quantisation, pruning and the training controls of the outlier note.

========================  ==================================================================
``quantization``          fake quantisers: scales, granularities, ranges, SmoothQuant's migration
``model_quantization``    quantising a model's linear layers; Nagel et al.'s bias corrections
``pruning``               statistics of linear-layer inputs; pruning with or without mean compensation
``training_controls``     tail-bound gradient clipping and the mean-and-Frobenius regulariser
========================  ==================================================================
"""

"""Text in, tensors out: corpus recipes and readers (files, the hub), cleaning and normalisation,
pass-through spans, the two SentencePiece vocabularies, encoded splits and token-budget batches."""

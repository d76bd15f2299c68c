"""Text in, token shards out: corpus recipes and readers (files, the hub), cleaning and
normalisation, pass-through spans, the two SentencePiece vocabularies and the encoded splits."""

"""Decoding: greedy and beam search, the engines (native PyTorch, CTranslate2 and its export),
the `Translator` that turns text into text, and sacreBLEU evaluation."""

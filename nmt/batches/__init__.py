"""Token shards in, tensors out: token-budget batches formed a window at a time and shared out
over ranks, collated into padded id tensors with their packings (`batching`), and what training
does to its pairs as it reads them: joined pairs added (`concat`), copy examples added
(`copy_spans`), segmentations resampled (`subword_sampling`). Reads what `nmt.data` wrote, without importing it."""

"""`nmt serve` (optional extra `nmt[serve]`): the HTTP app, the batcher that decodes concurrent
requests together, worker processes, attention maps, drawn figures and the web page."""

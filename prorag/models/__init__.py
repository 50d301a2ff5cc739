"""Policies and tokenizers: the trajectory tags on any Hugging Face tokenizer (:mod:`.tags`), the
world tokenizer (:mod:`.world_tokenizer`), tiny models (:mod:`.tiny`), loading and saving
(:mod:`.checkpoints`), offline conversion of a packaged model (:mod:`.offline`), and scoring: batches
packed without padding (:mod:`.packing`) and log-probabilities without the full logits (:mod:`.logprobs`).

The package root re-exports nothing: import from the module that holds the name.
"""

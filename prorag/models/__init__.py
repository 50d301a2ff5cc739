"""Policies and tokenizers: the trajectory tags on any Hugging Face tokenizer (:mod:`.tags`), the
world tokenizer (:mod:`.world_tokenizer`), tiny models (:mod:`.tiny`), loading and saving
(:mod:`.checkpoints`) and offline conversion of a packaged model (:mod:`.offline`).

The package root re-exports nothing: import from the module that holds the name.
"""

"""Data: records and corpus passages, JSONL io, benchmark loaders, corpus building, the built-in world."""

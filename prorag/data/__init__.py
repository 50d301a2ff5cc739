"""The data layer: records and corpus passages, JSONL io, the one safetensors loader, benchmark
loaders, corpus building, the built-in world. May import only core (``tests/test_layers.py``).
"""

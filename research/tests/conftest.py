"""The fixtures of tests/conftest.py, for the research tests (a conftest applies to its own folder only)."""

from tests.conftest import _test_llm_key, one_thread, tiny_world, world_tokenizer  # noqa: F401

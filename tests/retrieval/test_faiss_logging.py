"""Loading the dense retriever prints none of faiss's loader INFO lines (issue 70), which read like
errors ("Could not load library with AVX512-SPR support"); its warnings still would."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_dense_retriever_logs_nothing_from_faiss_at_info() -> None:
    code = (
        "import logging; logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s')\n"
        "import prorag.retrieval.dense\n"
        "assert logging.getLogger('faiss.loader').getEffectiveLevel() == logging.WARNING\n"
        "assert 'faiss' in __import__('sys').modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "faiss" not in result.stderr, result.stderr

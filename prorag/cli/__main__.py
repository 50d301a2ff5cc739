"""``python -m prorag.cli`` (also under ``torchrun ... -m prorag.cli``)."""

from prorag.cli import main

main()

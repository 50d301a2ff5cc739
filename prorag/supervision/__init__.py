"""The supervision layer: who labels and scores steps: the oracle and LLM step judges, the process
reward model (scalar head or likelihood) and the LLM teacher of stage 1's thoughts.
May import core .. method; never evaluation, stages, experiments or cli (``tests/test_layers.py``).
"""

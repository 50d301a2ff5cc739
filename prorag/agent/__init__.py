"""The agent layer: the trajectory format (tags, parsers, I_step/I_traj), prompts, the batched
multi-turn rollout engine and gold trajectories (docs/METHOD.md §1).
May import core, data and retrieval; nothing above (``tests/test_layers.py``).
"""

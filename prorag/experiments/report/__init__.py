"""The report a person reads after a pipeline run: ``report.md``, ``report.html`` and ``plots/``.

Input: a pipeline run folder (:mod:`.results`). Output, in the same folder, written by
:func:`~prorag.experiments.report.build.write_report`: the paper's figures on this run
(:mod:`.plots`), ``report.md`` with the tables (:mod:`.table`, :mod:`.markdown`) and one
self-contained ``report.html`` (:mod:`.html`) with the same tables and plots and a trajectory
viewer (:mod:`.viewer`) showing each test question's steps with their PRM scores
(:mod:`.step_scores`) and the RL learning curves (:mod:`.curves`).

The package root re-exports nothing: import from the module that holds the name.
"""

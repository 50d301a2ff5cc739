"""The built-in world: a seeded fictional encyclopedia with multi-hop questions.

See :mod:`prorag.data.world.generator` for how splits are made so that answers must be read,
:mod:`prorag.data.world.names` for the shared name pool, :mod:`prorag.data.world.facts` for the
relations, :mod:`prorag.data.world.documents` for the pages, :mod:`prorag.data.world.questions`
for the question kinds, and :mod:`prorag.data.world.audit` for the memorisation audit.
"""

from prorag.data.world.generator import SIZES, WorldConfig, WorldSummary, build_world

__all__ = ["SIZES", "WorldConfig", "WorldSummary", "build_world"]

"""The boosting hyper-parameters every tree protocol shares, as the wire carries them.

``TreeParams`` travels nested in the openers of vertical SecureBoost, the horizontal protocol
and SimFL (``JobSpec.params``, ``HorizontalSpec.params``, ``SimflSpec.params``). It is declared
once, with its defaults, bounds and docstrings, in ``boosting.params`` (a module of the standard
library alone): decoding an opener checks the bounds, a worker turns it into the core's
``BoostParams`` whole (``BoostParams(**asdict(p))``), and the job file's ``params:`` schema
(``flows.job_schema``) is made from its fields.
"""

from __future__ import annotations

from boosting.params import OBJECTIVES, TreeParams, bounds

__all__ = ["OBJECTIVES", "TreeParams", "bounds"]

"""Local: every client trains its own model alone; nothing is communicated.

The lower bound of every table: it shows what federation adds.
"""

from __future__ import annotations

from fedtsp.algorithms.base import Algorithm, register


@register
class Local(Algorithm):
    name = "local"

"""Local: every client trains its own model alone; nothing is communicated.

The lower bound of every table: it shows what federation adds.
"""

from __future__ import annotations

from fedtsp.algorithms.base import Algorithm, ClientHalf, ServerHalf, register

# Both halves are the defaults: local training, nothing sent.
Local = register(Algorithm("local", ClientHalf, ServerHalf))

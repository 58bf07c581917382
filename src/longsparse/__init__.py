"""longsparse: sparse attention that generalises to long contexts."""

from longsparse.attention import attention, explain_attention
from longsparse.mappings import *  # noqa: F401,F403
from longsparse.mappings import __all__ as _mappings_all

__version__ = "0.1.0"
__all__ = ["attention", "explain_attention", *_mappings_all]

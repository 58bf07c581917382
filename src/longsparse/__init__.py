"""longsparse: sparse attention that generalises to long contexts."""

import warnings

with warnings.catch_warnings():
    # Without NumPy, `import torch` warns "Failed to initialize NumPy" (even before `longsparse --help`);
    # longsparse never hands torch a NumPy array, so the warning only alarms. Filtered while torch loads, here.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch  # noqa: F401

from longsparse.attention import attention, explain_attention  # noqa: E402
from longsparse.mappings import *  # noqa: F401,F403
from longsparse.mappings import __all__ as _mappings_all

__version__ = "0.1.0"
__all__ = ["attention", "explain_attention", *_mappings_all]

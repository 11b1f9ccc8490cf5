"""The CPU oracle: numpy evaluation of every primitive op and of fused attention, as plain formulas.

Test-side: tests and device checks compare against it; generation never calls it.
"""

from .attention import attention_reference
from .oracle import EvalError, Oracle, evaluate

__all__ = ["EvalError", "Oracle", "evaluate", "attention_reference"]

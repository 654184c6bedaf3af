"""Internal building blocks: validation, backend dispatch, custom-op registration."""

from mate._core.checks import check_inputs_enabled
from mate._core.dispatch import interpreter_active, select_backend

__all__ = ["check_inputs_enabled", "interpreter_active", "select_backend"]

"""Adapters into the frameworks hosts already use; each module needs its framework's extra
and is imported on its own (``from lamina.adapters.pydantic_ai import LaminaHistory``)."""

__all__: list[str] = []

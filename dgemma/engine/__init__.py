"""The engine: requests in, events out (EngineCore steps; Engine drives it on a thread)."""

from dgemma.engine.core import EngineConfig, EngineCore, EngineError
from dgemma.engine.engine import Engine

__all__ = ["Engine", "EngineConfig", "EngineCore", "EngineError"]

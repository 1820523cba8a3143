"""The engine: requests in, events out (EngineCore steps; `drive` is the one loop over it: Engine runs it on a
thread, CallDriver in a process of its own, one call at a time)."""

from dgemma.engine.core import EngineConfig, EngineCore, EngineError
from dgemma.engine.driver import CallDriver, drive
from dgemma.engine.engine import Engine

__all__ = ["CallDriver", "Engine", "EngineConfig", "EngineCore", "EngineError", "drive"]

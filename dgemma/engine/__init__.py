"""The engine: requests in, events out."""

from dgemma.engine.engine import FINAL, Engine, EngineConfig, EngineError, RequestHandle, plan_dict

__all__ = ["FINAL", "Engine", "EngineConfig", "EngineError", "RequestHandle", "plan_dict"]

"""The views: what the page draws from the event stream and plain data (never torch or the engine)."""

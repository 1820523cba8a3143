"""The engine: requests in, events out."""

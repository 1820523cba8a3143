"""The app's UI: pure renderers (board, canvas, charts), the layout, the lesson and the API.

Only engine_backend.py touches the engine; everything else reads events and settings.
"""

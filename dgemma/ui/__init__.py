"""The views: what the page draws from the event stream and plain data (never torch or the engine).

page composes the title, the tabs and the API; generate/ and lesson/ are the two tabs; board,
stream, canvas and charts are the views both share. All work goes through dgemma/serving's Backend.
"""

"""Memory: how much is free, how much a step needs, and how to tile it."""

"""Serving: how a click or an API call becomes engine work (docs/architecture.md, "Serving")."""

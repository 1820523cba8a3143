"""The Generate tab: prompts and settings in, live cards, charts, status line and playback out."""

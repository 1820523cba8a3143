"""The Tiling vs OOM tab: one batch untiled, tiled and chunked, its step-through and the explorer."""

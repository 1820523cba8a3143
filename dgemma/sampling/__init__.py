"""The sampler: one denoising step over many requests' canvases, tiled against free memory."""

"""Lab code on PyTorch: measurements, the overlap probe, the model split, staleness, co-design, the reference."""

"""gpu-slicer webhook package."""

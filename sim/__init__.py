"""gpu-slicer sim package."""

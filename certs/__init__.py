"""gpu-slicer certs package."""

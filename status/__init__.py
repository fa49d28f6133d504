"""``gpu-slicer status``: what the cluster's GPUs hold now (view, render, cli)."""

"""The node agent: a DRA driver that slices NVIDIA GPUs with MIG just in time."""

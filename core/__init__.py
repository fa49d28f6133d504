"""What the webhook and the node agent share, and nothing else: the names that bind them (the
driver, its DeviceClasses and attributes), the MIG model and catalog, device names, modes and
taints, and the errors every package's own derive from. It imports nothing of the project, so
either component can be read, tested and released on top of it alone."""

"""The ``gpu-slicer`` command: one entry point, subcommands registered by each package."""

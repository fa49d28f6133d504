"""gpu-slicer: legacy GPU requests turned into DRA claims, and MIG slices made just in time.

One import namespace for everything the distribution installs. The packages live at the
repository's top level (``core/``, ``kube/``, ``webhook/``, ``slicer/``, ...) and this folder
links each into the namespace, so ``gpu_slicer.webhook`` is ``webhook/`` in a checkout and in an
installed wheel alike. The layers, from ``core`` (what the two components share; it imports
nothing of the project) up to the ``cli``, are the import-linter contract in pyproject.toml,
drawn in docs/architecture.md.

``gpu_slicer.sandbox`` (the development sandbox: control plane, kubelet, image builds) is
linked here for a checkout only; the distribution does not install it.
"""

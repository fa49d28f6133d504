"""gpu-slicer: legacy GPU requests turned into DRA claims, and MIG slices made just in time.

One import namespace for everything the distribution installs. The packages live at the
repository's top level (``core/``, ``kube/``, ``webhook/``, ``slicer/``, ...) and this folder
links each into the namespace, so ``gpu_slicer.webhook`` is ``webhook/`` in a checkout and in an
installed wheel alike. The layers, lowest first (checked by import-linter, pyproject.toml):

* ``core``: what the two components share (names, MIG model and catalog, devices, errors);
* ``kube``: the Kubernetes API layer;
* ``webhook`` | ``slicer`` | ``certs``: the admission webhook, the node agent, TLS;
* ``sim``, ``plan``, ``status``: the simulator and the admins' read-only tools;
* ``cli``: the ``gpu-slicer`` command.

``gpu_slicer.sandbox`` (the development sandbox: control plane, kubelet, image builds) is
linked here for a checkout only; the distribution does not install it.
"""

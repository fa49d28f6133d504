"""The Kubernetes API seam shared by the webhook, the agent, certs and the simulator.

``kube.api.KubeApi`` is the interface; ``kube.client.RealKubeApi`` implements it on the official
``kubernetes`` client, ``kube.memory.InMemoryKubeApi`` in memory (tests and the simulator).
"""

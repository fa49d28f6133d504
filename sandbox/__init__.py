"""A real Kubernetes control plane on one machine, with simulated GPUs and a kubelet stand-in.

``gpu-slicer sandbox up`` runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler
built from the Kubernetes Go modules (:mod:`sandbox.binaries`), the gpu-slicer webhook and one
agent per node, and a kubelet stand-in per node (:mod:`sandbox.kubelet`). The end-to-end test
tier runs on it.
"""

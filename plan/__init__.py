"""``gpu-slicer plan``: what enabling gpu-slicer in a namespace would do, before enabling it.

It reads the cluster (never writes): the namespaces' workloads and bare pods, the webhook's
policy (ConfigMap ``gpu-slicer-policy``, or ``--policy``), DeviceClasses that serve legacy names
(KEP-5004) and the GPU nodes. Each pod template goes through the webhook's own translation
(:func:`webhook.translate.translate_pod`), so the verdicts are the webhook's. Then the simulator
runs the converted workloads on the cluster's GPU nodes twice, as today (whole GPUs and the MIG
layout the nodes advertise) and with gpu-slicer, and reports who gets a GPU in each.
"""

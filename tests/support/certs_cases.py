"""Constants and object builders the certs tests share (fixtures are in conftest.py)."""

from __future__ import annotations

import datetime as dt

from gpu_slicer.kube.api import Obj

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
NAMESPACE = "gpu-slicer"
SERVICE = "gpu-slicer-webhook"
SECRET = "gpu-slicer-webhook-tls"
CONFIG = "gpu-slicer"


def webhook_configuration(*names: str) -> Obj:
    """A MutatingWebhookConfiguration shaped like the one in deploy/base."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [
            {
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "NoneOnDryRun",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 5,
                "clientConfig": {
                    "service": {
                        "name": SERVICE,
                        "namespace": NAMESPACE,
                        "path": "/mutate-pods",
                        "port": 443,
                    },
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
            }
            for name in (names or ("pods.gpu-slicer.io",))
        ],
    }

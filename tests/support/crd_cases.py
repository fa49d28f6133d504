"""CustomResourceDefinitions written for the tests, in the shape controller-gen makes them."""

from __future__ import annotations

from typing import Any


def pytorch_crd(claim_fields: list[str]) -> dict[str, Any]:
    """A PyTorchJob CRD whose pod template knows ``claim_fields`` in resourceClaims items."""
    claims = {
        "type": "array",
        "items": {"type": "object", "properties": {f: {"type": "string"} for f in claim_fields}},
    }
    container = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "resources": {
                "type": "object",
                "properties": {
                    "claims": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "request": {"type": "string"},
                            },
                        },
                    },
                    "limits": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            },
        },
    }
    template = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "resourceClaims": claims,
                    "containers": {"type": "array", "items": container},
                },
            }
        },
    }
    replica = {"type": "object", "properties": {"template": template}}
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "pytorchReplicaSpecs": {"type": "object", "additionalProperties": replica}
                },
            }
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "pytorchjobs.kubeflow.org"},
        "spec": {
            "group": "kubeflow.org",
            "names": {"kind": "PyTorchJob", "plural": "pytorchjobs"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }

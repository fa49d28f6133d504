"""Objects for the status tests, shaped as the cluster holds them: ResourceSlices built by the
agent's own inventory code (so attributes and counters are what the agent publishes), and
ResourceClaims, Pods and Namespaces as the sandbox's real control plane stored them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gpu_slicer.core import catalog
from gpu_slicer.core.devices import DeviceTaint, Mode, SliceSpec
from gpu_slicer.core.identity import DRIVER
from gpu_slicer.slicer.inventory import GpuState, default_mode, plan_pool
from gpu_slicer.slicer.profile_filter import ProfileChoice
from gpu_slicer.slicer.simulated import SimulatedBackend

Obj = dict[str, Any]


def node_slices(
    node: str,
    gpus: str,
    *,
    mode: Mode | None = None,
    foreign: dict[int, Sequence[tuple[str, int]]] | None = None,
    made: dict[int, Sequence[tuple[str, int]]] | None = None,
    static: bool = False,
    unhealthy: Sequence[int] = (),
    server_version: tuple[int, int] = (1, 36),
    generation: int = 1,
    profiles: ProfileChoice | None = None,
) -> list[Obj]:
    """The ResourceSlices the agent publishes for ``node`` with simulated ``gpus``;
    ``foreign`` are MIG instances made behind the agent's back (on the GPU, in no claim),
    ``made`` instances the agent created; ``static``: the static layout (no counters)."""
    backend = SimulatedBackend(gpus, node_name=node)
    owned: dict[int, frozenset[SliceSpec]] = {}
    for index, placements in [*(foreign or {}).items(), *(made or {}).items()]:
        backend.set_mig_mode(index, True)
        for profile, start in placements:
            backend.create_compute_instance(
                index, backend.create_gpu_instance(index, profile, start)
            )
    for index, placements in (made or {}).items():
        owned[index] = frozenset(SliceSpec(index, p, s) for p, s in placements)
    states = []
    for info in backend.gpus():
        taints = (
            (DeviceTaint("gpu-slicer.io/unhealthy", "xid-79"),) if (info.index in unhealthy) else ()
        )
        model = catalog.get_model(info.model)
        states.append(
            GpuState(
                info,
                mode=mode or default_mode(model),
                instances=tuple(backend.instances(info.index)),
                owned=owned.get(info.index, frozenset()),
                taints=taints,
            )
        )
    return plan_pool(
        node,
        states,
        server_version=server_version,
        generation=generation,
        device_order="best-fit",
        static=static,
        profiles=profiles,
    ).slices


def namespace(name: str, migration: str | None = None) -> Obj:
    meta: Obj = {"name": name}
    if migration is not None:
        meta["labels"] = {"gpu-slicer.io/migration": migration}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def pod(
    ns: str,
    name: str,
    *,
    converted: bool = True,
    legacy: dict[str, Any] | None = None,
    template_hash: str | None = None,
    uid: str | None = None,
) -> Obj:
    """A pod; ``converted``: as the webhook left it (annotation, claim), else as written."""
    meta: Obj = {"name": name, "namespace": ns, "uid": uid or f"uid-{ns}-{name}"}
    if template_hash:
        meta["labels"] = {"app": name.split("-")[0], "pod-template-hash": template_hash}
    container: Obj = {"name": "main", "image": "busybox"}
    spec: Obj = {"containers": [container]}
    if converted:
        meta["annotations"] = {
            "gpu-slicer.io/converted": json.dumps(
                {
                    "claim": "gpu-slicer",
                    "template": "gpu-slicer-823b1346c3",
                    "containers": [
                        {
                            "container": "main",
                            "from": {"nvidia.com/mig-1g.10gb": 1},
                            "request": "main",
                            "to": ["1 x 1g.10gb"],
                        }
                    ],
                }
            )
        }
        container["resources"] = {"claims": [{"name": "gpu-slicer", "request": "main"}]}
        spec["resourceClaims"] = [
            {"name": "gpu-slicer", "resourceClaimTemplateName": "gpu-slicer-823b1346c3"}
        ]
    elif legacy:
        container["resources"] = {"limits": legacy}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def claim(
    ns: str,
    name: str,
    node: str,
    devices: Sequence[str],
    *,
    pods: Sequence[Obj] = (),
    driver: str = DRIVER,
) -> Obj:
    """A ResourceClaim allocated ``devices`` of ``node``'s pool and reserved for ``pods``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-claim-{name}"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "main",
                        "exactly": {
                            "deviceClassName": "mig.gpu-slicer.io",
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "main", "driver": driver, "pool": node, "device": d}
                        for d in devices
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [
                {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
                for p in pods
            ],
        },
    }


INFER = [
    pod("ml", f"infer-749bf8c799-{s}", template_hash="749bf8c799")
    for s in ("dlqzb", "ss84s", "zpnn4")
]
TRAIN = pod("ml", "train")
WHOLE = pod("ml", "whole")


def sandbox_like() -> dict[str, list[Obj]]:
    """What the sandbox held after a by-hand run (docs/status.md shows its picture): an A100
    with three 1g.10gb replicas and a 3g.40gb pod, two H100s, one held whole; an audit
    namespace with a legacy pod."""
    return {
        "slices": node_slices("a100", "A100-80GB:1") + node_slices("h100", "H100-80GB:2"),
        "claims": [
            *(
                claim(
                    "ml",
                    f"{p['metadata']['name']}-gpu-slicer-x",
                    "a100",
                    [f"gpu-0-mig-1g10gb-{i + 1}"],
                    pods=[p],
                )
                for i, p in enumerate(INFER)
            ),
            claim("ml", "train-gpu-slicer-gnw8k", "a100", ["gpu-0-mig-3g40gb-4"], pods=[TRAIN]),
            claim("ml", "whole-gpu-slicer-cz5sr", "h100", ["gpu-0"], pods=[WHOLE]),
        ],
        "pods": [
            *INFER,
            TRAIN,
            WHOLE,
            pod("aud", "legacy", converted=False, legacy={"nvidia.com/gpu": 1}),
            pod("gpu-slicer", "gpu-slicer-agent-a100", converted=False),
        ],
        "namespaces": [
            namespace("ml", "enabled"),
            namespace("aud", "audit"),
            namespace("gpu-slicer"),
            namespace("default"),
        ],
    }


# The JSON document of ``gpu-slicer status -o json`` (docs/status.md describes it).
STATUS_SCHEMA: Obj = {
    "type": "object",
    "required": ["nodes", "namespaces", "notes"],
    "additionalProperties": False,
    "properties": {
        "nodes": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": [
                    "name",
                    "generation",
                    "memorySlices",
                    "freeMemorySlices",
                    "advertised",
                    "gpus",
                ],
                "properties": {
                    "name": {"type": "string"},
                    "generation": {"type": "integer"},
                    "memorySlices": {"type": "integer", "minimum": 0},
                    "freeMemorySlices": {"type": "integer", "minimum": 0},
                    "advertised": {
                        "type": ["object", "null"],
                        "additionalProperties": False,
                        "required": ["everyProfile", "profiles"],
                        "properties": {
                            "everyProfile": {"type": "boolean"},
                            "profiles": {
                                "type": "object",
                                "additionalProperties": {
                                    "enum": ["asked", "recent", "floor", "all"]
                                },
                            },
                        },
                    },
                    "gpus": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": [
                                "index",
                                "productName",
                                "mode",
                                "unhealthy",
                                "memorySlices",
                                "freeSlices",
                                "blockedSlices",
                                "idleInstances",
                                "instances",
                            ],
                            "properties": {
                                "index": {"type": "integer", "minimum": 0},
                                "productName": {"type": "string"},
                                "mode": {"enum": ["dynamic", "mig", "full", "static", "unknown"]},
                                "unhealthy": {"type": "boolean"},
                                "memorySlices": {"type": "integer", "minimum": 1},
                                "freeSlices": {"type": "array", "items": {"type": "integer"}},
                                "blockedSlices": {"type": "array", "items": {"type": "integer"}},
                                "idleInstances": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "required": ["profile", "placementStart", "placementSize"],
                                        "properties": {
                                            "profile": {"type": "string"},
                                            "placementStart": {"type": "integer"},
                                            "placementSize": {"type": "integer"},
                                        },
                                    },
                                },
                                "instances": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "required": [
                                            "device",
                                            "profile",
                                            "wholeGpu",
                                            "placementStart",
                                            "placementSize",
                                            "claim",
                                            "request",
                                            "pods",
                                        ],
                                        "properties": {
                                            "device": {"type": "string"},
                                            "profile": {"type": ["string", "null"]},
                                            "wholeGpu": {"type": "boolean"},
                                            "placementStart": {"type": "integer", "minimum": 0},
                                            "placementSize": {"type": "integer", "minimum": 1},
                                            "claim": {"$ref": "#/$defs/ref"},
                                            "request": {"type": "string"},
                                            "pods": {
                                                "type": "array",
                                                "items": {"$ref": "#/$defs/ref"},
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
        "namespaces": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": [
                    "name",
                    "migration",
                    "convertedPods",
                    "podsHoldingDevices",
                    "legacyPods",
                ],
                "properties": {
                    "name": {"type": "string"},
                    "migration": {"type": ["string", "null"]},
                    "convertedPods": {"type": "integer", "minimum": 0},
                    "podsHoldingDevices": {"type": "integer", "minimum": 0},
                    "legacyPods": {"type": "integer", "minimum": 0},
                },
            },
        },
        "notes": {"type": "array", "items": {"type": "string"}},
    },
    "$defs": {
        "ref": {
            "type": "object",
            "additionalProperties": False,
            "required": ["namespace", "name"],
            "properties": {"namespace": {"type": "string"}, "name": {"type": "string"}},
        }
    },
}

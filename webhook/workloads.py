"""Where each kind of object keeps the pods it makes: the table ``convert`` and ``plan`` read.

Kinds are matched by API group and kind, never by kind alone: a Volcano ``Job``
(``batch.volcano.sh``) is not a ``batch/v1`` Job. Each entry lists paths to *pod templates*
(a mapping with ``metadata`` and ``spec``, as in a Deployment) and to *pod specs* written inline
(KServe's predictor). A path is dot-separated keys; ``[]`` after a key means every item of that
list, ``*`` every value of a map (Kubeflow's replica specs are a map keyed by replica type).
The operators' paths come from each project's Go API types; docs/migration-guide.md lists them
with the versions they were read from. An operator's kind is converted only where its shipped
CRDs were seen to keep the claim (``checked``), or when the policy's ``workloads`` opts it in;
the policy also adds entries for other kinds.

Kinds whose pods come from something that is not a pod template (a TrainJob's
``resourcesPerNode``, an Argo template's ``container``) have no paths, and a ``note`` that says
why: ``convert`` leaves them alone and names them when they ask for GPUs; the webhook still
converts their pods at admission.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpu_slicer.core.identity import LEGACY_GPU, LEGACY_MIG_PREFIX
from gpu_slicer.webhook.errors import WorkloadPathError
from gpu_slicer.webhook.sharing import is_sharing_resource

Step = str | int
"""A key of a mapping or an index of a list, in a concrete path."""


_KEY = re.compile(r"^(?:\*|[A-Za-z_][A-Za-z0-9_-]*(?:\[\])?)$")


def parse_path(text: str) -> tuple[str, ...]:
    """``spec.tasks[].template`` -> ``("spec", "tasks", "[]", "template")``; raises
    WorkloadPathError."""
    if not isinstance(text, str) or not text:
        raise WorkloadPathError("a path is dot-separated keys, such as spec.template")
    steps: list[str] = []
    for key in text.split("."):
        if not _KEY.match(key):
            raise WorkloadPathError(
                f"{text!r}: {key!r} is not a key (letters, digits, '_' and '-'; 'key[]' for "
                "every item of a list, '*' for every value of a map)"
            )
        if key.endswith("[]"):
            steps += [key[:-2], "[]"]
        else:
            steps.append(key)
    return tuple(steps)


@dataclass(frozen=True)
class Workload:
    """One kind's pod templates and inline pod specs (parsed paths)."""

    group: str
    kind: str
    templates: tuple[tuple[str, ...], ...] = ()
    specs: tuple[tuple[str, ...], ...] = ()
    note: str = ""
    """Why a kind with no paths is left alone, or why GPU requests outside its paths are."""
    built_in: bool = False
    """A Kubernetes kind: its one template must be there (the API server requires it)."""
    checked: str = ""
    """For an operator's kind: the CRDs on which a converted object was seen to keep its claims
    (tests/e2e/test_operator_crds.py), or ``policy`` when the policy opts the kind in. A CRD
    whose schema predates the DRA API prunes the claim and the pod runs without a GPU, so a
    kind not checked (or seen to prune: then ``note`` says so) is left alone."""
    runs_in: str = ""
    """For a cluster-scoped kind: the namespaced kind whose namespace its pods run in (a
    ClusterTrainingRuntime's pods run in each TrainJob's), where the claim template must be."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.kind)


def _entry(
    group: str,
    kind: str,
    templates: tuple[str, ...] = (),
    specs: tuple[str, ...] = (),
    note: str = "",
    *,
    built_in: bool = False,
    checked: str = "",
    runs_in: str = "",
) -> Workload:
    return Workload(
        group,
        kind,
        tuple(parse_path(p) if p else () for p in templates),
        tuple(parse_path(p) for p in specs),
        note,
        built_in,
        checked,
        runs_in,
    )


KUBERAY = "KubeRay v1.5.0"
TRAINING_OPERATOR = "Kubeflow training operator v1.9.0 (v1.8.1 prunes the claim)"
TRAINER = "Kubeflow Trainer v2.0.0"
JOBSET = "JobSet v0.8.2"
LWS = "LeaderWorkerSet v0.6.1"
KSERVE = "KServe v0.15.0"
UNCHECKED = (
    "its CRD was not checked to keep resourceClaims (a CRD from an older PodSpec prunes them "
    "and the pod runs without a GPU); after a server-side dry run shows it does, opt the kind "
    "in with the policy's workloads"
)


_TRAINING_REPLICAS = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
}
_ARGO_NOTE = (
    "Argo templates hold containers, not pod templates, so the pod's claim has nowhere to go; "
    "the webhook converts the workflow's pods at admission"
)

_RUNTIME_NOTE = (
    "a KServe serving runtime's containers are merged into the pod of each InferenceService "
    "that uses it, and its spec has no resourceClaims for the claim; the webhook converts "
    "those pods at admission"
)
_KNATIVE_NOTE = (
    "Knative Serving accepts only the PodSpec fields its feature flags allow and was not "
    "checked to keep resourceClaims; the webhook converts the revision's pods at admission"
)

BUILT_IN: tuple[Workload, ...] = (
    _entry("", "Pod", ("",), built_in=True),
    _entry("", "PodTemplate", ("template",), built_in=True),
    _entry("", "ReplicationController", ("spec.template",), built_in=True),
    *(
        _entry("apps", kind, ("spec.template",), built_in=True)
        for kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")
    ),
    _entry("batch", "Job", ("spec.template",), built_in=True),
    _entry("batch", "CronJob", ("spec.jobTemplate.spec.template",), built_in=True),
)
"""Kubernetes' own workload kinds (a Pod is its own template: the empty path)."""

OPERATORS: tuple[Workload, ...] = (
    # Kubeflow training operator v1 (kubeflow.org/v1 ReplicaSpec.Template); mpi-operator v2beta1
    # keeps the same mpiReplicaSpecs map.
    *(
        _entry(
            "kubeflow.org",
            kind,
            (f"spec.{field}.*.template",),
            checked=TRAINING_OPERATOR,
        )
        for kind, field in _TRAINING_REPLICAS.items()
    ),
    # Kubeflow notebook controller (kubeflow.org/v1 NotebookSpec.Template).
    _entry("kubeflow.org", "Notebook", ("spec.template",)),
    # Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1): runtimes hold a JobSet template.
    *(
        _entry(
            "trainer.kubeflow.org",
            kind,
            ("spec.template.spec.replicatedJobs[].template.spec.template",),
            checked=TRAINER,
            runs_in=runs_in,
        )
        for kind, runs_in in (("TrainingRuntime", ""), ("ClusterTrainingRuntime", "TrainJob"))
    ),
    _entry(
        "trainer.kubeflow.org",
        "TrainJob",
        note=(
            "a TrainJob asks for devices through spec.trainer.resourcesPerNode, not a pod "
            "template; convert its TrainingRuntime, or let the webhook convert its pods"
        ),
    ),
    # KubeRay (ray.io/v1): head and worker groups' PodTemplateSpec, the RayJob submitter.
    _entry(
        "ray.io",
        "RayCluster",
        ("spec.headGroupSpec.template", "spec.workerGroupSpecs[].template"),
        checked=KUBERAY,
    ),
    _entry(
        "ray.io",
        "RayJob",
        (
            "spec.rayClusterSpec.headGroupSpec.template",
            "spec.rayClusterSpec.workerGroupSpecs[].template",
            "spec.submitterPodTemplate",
        ),
        checked=KUBERAY,
    ),
    _entry(
        "ray.io",
        "RayService",
        (
            "spec.rayClusterConfig.headGroupSpec.template",
            "spec.rayClusterConfig.workerGroupSpecs[].template",
        ),
        checked=KUBERAY,
    ),
    # JobSet (jobset.x-k8s.io/v1alpha2 ReplicatedJob.Template is a batch/v1 JobTemplateSpec).
    _entry(
        "jobset.x-k8s.io",
        "JobSet",
        ("spec.replicatedJobs[].template.spec.template",),
        checked=JOBSET,
    ),
    # LeaderWorkerSet (leaderworkerset.x-k8s.io/v1 LeaderWorkerTemplate).
    _entry(
        "leaderworkerset.x-k8s.io",
        "LeaderWorkerSet",
        (
            "spec.leaderWorkerTemplate.leaderTemplate",
            "spec.leaderWorkerTemplate.workerTemplate",
        ),
        checked=LWS,
    ),
    # KServe (serving.kserve.io/v1beta1): each component inlines a PodSpec.
    _entry(
        "serving.kserve.io",
        "InferenceService",
        specs=("spec.predictor", "spec.transformer", "spec.explainer"),
        note=(
            "KServe builds this container from a model or framework shortcut (or a serving "
            "runtime), so its pod's claim is not in the object; the webhook converts the pod at "
            "admission, or write the component's containers out"
        ),
        checked=KSERVE,
    ),
    # KServe serving runtimes (serving.kserve.io/v1alpha1): containers merged into each
    # InferenceService's predictor pod; ServingRuntimePodSpec has no resourceClaims.
    *(
        _entry("serving.kserve.io", kind, note=_RUNTIME_NOTE)
        for kind in ("ServingRuntime", "ClusterServingRuntime")
    ),
    # Knative Serving (serving.knative.dev/v1): a revision template's PodSpec, restricted to
    # the fields Knative's feature flags allow.
    _entry("serving.knative.dev", "Service", note=_KNATIVE_NOTE),
    # Volcano (batch.volcano.sh/v1alpha1 TaskSpec.Template).
    _entry("batch.volcano.sh", "Job", ("spec.tasks[].template",)),
    # Argo Workflows (argoproj.io/v1alpha1).
    *(
        _entry("argoproj.io", kind, note=_ARGO_NOTE)
        for kind in ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow")
    ),
)
"""Operators' kinds, from each project's API types."""


def opt_in(group: str, kind: str) -> Workload | None:
    """The table's entry for an operator's kind, opted in by the policy (None: not in it)."""
    for workload in OPERATORS:
        if workload.key == (group, kind) and (workload.templates or workload.specs):
            return Workload(
                group,
                kind,
                workload.templates,
                workload.specs,
                checked="policy",
                runs_in=workload.runs_in,
            )
    return None


def group_of(api_version: Any) -> str | None:
    """``apps/v1`` -> ``apps``, ``v1`` -> ``""``; None when it is not an apiVersion."""
    if not isinstance(api_version, str) or not api_version:
        return None
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


class WorkloadTable:
    """The built-in and operator kinds, plus the policy's; later entries win per kind."""

    def __init__(self, extra: tuple[Workload, ...] = ()) -> None:
        self._by_key: dict[tuple[str, str], Workload] = {w.key: w for w in (*BUILT_IN, *OPERATORS)}
        for workload in extra:  # a policy's entry keeps what the kind's scope is
            known = self._by_key.get(workload.key)
            runs_in = known.runs_in if known is not None else ""
            self._by_key[workload.key] = replace(workload, runs_in=runs_in)

    def convertible(self, workload: Workload) -> bool:
        """Kubernetes' kinds, and operators' kinds checked to keep claims (or opted in)."""
        return workload.built_in or bool(workload.checked)

    def __iter__(self) -> Iterator[Workload]:
        return iter(self._by_key.values())

    def lookup(self, obj: Mapping[str, Any]) -> Workload | None:
        """The entry of ``obj``'s group and kind, if any."""
        group = group_of(obj.get("apiVersion"))
        kind = obj.get("kind")
        if group is None or not isinstance(kind, str):
            return None
        return self._by_key.get((group, kind))


DEFAULT_TABLE = WorkloadTable()


def expand(obj: Any, path: tuple[str, ...]) -> Iterator[tuple[Step, ...]]:
    """Every concrete path in ``obj`` that ``path`` names and that holds a mapping."""
    if not path:
        if isinstance(obj, dict):
            yield ()
        return
    head, rest = path[0], path[1:]
    if head == "[]":
        if isinstance(obj, list):
            for i, item in enumerate(obj):
                yield from ((i, *tail) for tail in expand(item, rest))
        return
    if not isinstance(obj, dict):
        return
    if head == "*":
        for key, value in obj.items():
            yield from ((str(key), *tail) for tail in expand(value, rest))
        return
    if head in obj:
        yield from ((head, *tail) for tail in expand(obj[head], rest))


def lookup(obj: Any, steps: tuple[Step, ...]) -> Any:
    """The node at a concrete path (from :func:`expand`)."""
    for step in steps:
        obj = obj[step]
    return obj


def show(steps: tuple[Step, ...]) -> str:
    """A concrete path as users write it: ``spec.tasks[1].template``."""
    out = ""
    for step in steps:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def gpu_requests(obj: Any, at: tuple[Step, ...] = ()) -> Iterator[tuple[str, str]]:
    """``(path, resource)`` for every GPU resource any ``resources`` mapping in ``obj`` asks for
    (legacy names, and the names of other sharing models): what an object that is left alone
    would still ask the scheduler for."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("limits", "requests") and isinstance(value, dict):
                for name in value:
                    if is_gpu_resource(str(name)):
                        yield show((*at, key)), str(name)
            else:
                yield from gpu_requests(value, (*at, str(key)))
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from gpu_requests(item, (*at, i))


def is_gpu_resource(name: str) -> bool:
    """A legacy GPU resource or one of another sharing model (HAMi, time-slicing)."""
    return (
        name == LEGACY_GPU
        or name.startswith(LEGACY_GPU + ".")
        or name.startswith(LEGACY_MIG_PREFIX)
        or is_sharing_resource(name)
    )

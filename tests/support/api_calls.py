"""Which Kubernetes API calls each component's code makes: the raw material for RBAC checks.

Two sources, kept honest against each other by tests/deploy/test_rbac.py:

- :func:`call_sites` reads the code (an AST scan, no import): every call of a ``KubeApi`` verb on
  a receiver named ``api`` or ``_api``, with apiVersion and kind resolved when they are string
  literals or module constants. Calls on an object argument (``create(obj)``) or on a generic
  cache's ``self.kind`` cannot be resolved statically.
- :data:`DECLARED` says, per component and module, which (verb, apiVersion, kind) those calls
  are. The test fails when the code has a call site the table does not cover, or the table lists
  a call the code no longer makes, so the table cannot drift from the code.

``certs ensure`` needs neither: its calls are derived by running it (test_rbac.py).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from tests.support.deploy_cases import ROOT

VERBS = frozenset({"get", "list", "watch", "create", "update", "apply", "patch", "delete"})
RECEIVERS = frozenset({"api", "_api"})
# Which packages hold each component's code, and the ServiceAccount it runs as.
# ``kube/watch_cache.py`` lists and watches for both: its calls on ``self.kind`` are declared per
# component with the kinds that component's caches watch.
WATCH_CACHE = "kube/watch_cache.py"
COMPONENTS: dict[str, tuple[str, ...]] = {
    "webhook": ("webhook", WATCH_CACHE),
    "agent": ("slicer", WATCH_CACHE),
}
SERVICE_ACCOUNTS = {
    "webhook": "gpu-slicer-webhook",
    "agent": "gpu-slicer-agent",
    "certs": "gpu-slicer-certs",
}


@dataclass(frozen=True)
class Site:
    module: str  # path relative to the repository root
    line: int
    verb: str
    api_version: str | None
    kind: str | None


@dataclass(frozen=True)
class Declared:
    module: str
    verb: str
    api_version: str
    kind: str
    why: str


NS = ("v1", "Namespace")
DC = ("resource.k8s.io/v1", "DeviceClass")
RCT = ("resource.k8s.io/v1", "ResourceClaimTemplate")
RS = ("resource.k8s.io/v1", "ResourceSlice")
RC = ("resource.k8s.io/v1", "ResourceClaim")

DECLARED: dict[str, list[Declared]] = {
    "webhook": [
        Declared(WATCH_CACHE, "list", *NS, "WatchCache of Namespaces (migration label)"),
        Declared(WATCH_CACHE, "watch", *NS, "WatchCache of Namespaces"),
        Declared("webhook/caches.py", "get", *NS, "namespace the cache has not seen yet"),
        Declared(WATCH_CACHE, "list", *DC, "WatchCache of DeviceClasses (KEP-5004)"),
        Declared(WATCH_CACHE, "watch", *DC, "WatchCache of DeviceClasses"),
        Declared(WATCH_CACHE, "list", "v1", "ResourceQuota", "WatchCache of quotas"),
        Declared(WATCH_CACHE, "watch", "v1", "ResourceQuota", "WatchCache of quotas"),
        Declared("webhook/templates.py", "create", *RCT, "template a converted pod names"),
        Declared("webhook/templates.py", "patch", *RCT, "last-referenced stamp"),
        Declared("webhook/templates.py", "list", *RCT, "GC: managed templates"),
        Declared("webhook/templates.py", "delete", *RCT, "GC: unused templates"),
        Declared("webhook/templates.py", "list", "v1", "Pod", "GC: is a template still named"),
    ],
    "agent": [
        Declared("slicer/publisher.py", "list", *RS, "this node's pool"),
        Declared("slicer/publisher.py", "get", *RS, "read back what was written"),
        Declared("slicer/publisher.py", "create", *RS, "publish"),
        Declared("slicer/publisher.py", "update", *RS, "republish"),
        Declared("slicer/publisher.py", "delete", *RS, "slices of an older generation"),
        Declared("slicer/publisher.py", "get", "v1", "Node", "owner reference, Event subject"),
        Declared("slicer/publisher.py", "create", "events.k8s.io/v1", "Event", "problems"),
        Declared("slicer/claim_cache.py", "get", *RC, "claim the kubelet asks to prepare"),
        Declared(WATCH_CACHE, "list", *RC, "claim cache"),
        Declared(WATCH_CACHE, "watch", *RC, "claim cache"),
        Declared(WATCH_CACHE, "list", *RCT, "what templates ask for (advertised profiles)"),
        Declared(WATCH_CACHE, "watch", *RCT, "what templates ask for"),
        Declared(WATCH_CACHE, "list", *RS, "this node's slices (put back what is deleted)"),
        Declared(WATCH_CACHE, "watch", *RS, "this node's slices"),
    ],
}


def _module_file(dotted: str) -> Path | None:
    path = ROOT / (dotted.replace(".", "/") + ".py")
    return path if path.is_file() else None


def _constants(tree: ast.Module, seen: frozenset[str] = frozenset()) -> dict[str, object]:
    """Module-level ``NAME = "text"`` and ``NAME = ("a", "b")`` assignments, following
    ``from <module of this repository> import NAME`` one module at a time."""
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            source = _module_file(node.module)
            if source is None or node.module in seen:
                continue
            imported = _constants(
                ast.parse(source.read_text(encoding="utf-8")), seen | {node.module}
            )
            for alias in node.names:
                if alias.name in imported:
                    found[alias.asname or alias.name] = imported[alias.name]
            continue
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name) and value is not None:
                try:
                    found[target.id] = ast.literal_eval(value)
                except ValueError:
                    pass
    return found


def _receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _resolve_args(call: ast.Call, constants: dict[str, object]) -> list[object]:
    values: list[object] = []
    for arg in call.args[:2]:
        if isinstance(arg, ast.Constant):
            values.append(arg.value)
        elif isinstance(arg, ast.Name):
            values.append(constants.get(arg.id))
        elif isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name):
            expanded = constants.get(arg.value.id)
            values.extend(expanded if isinstance(expanded, tuple) else [None])
        else:
            values.append(None)
    return values


@functools.cache
def call_sites(packages: tuple[str, ...]) -> tuple[Site, ...]:
    sites: list[Site] = []
    for package in packages:
        root = ROOT / package
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            constants = _constants(tree)
            module = path.relative_to(ROOT).as_posix()
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr not in VERBS or _receiver(node.func.value) not in RECEIVERS:
                    continue
                api_version = kind = None
                if node.func.attr not in ("create", "update", "apply"):
                    args = _resolve_args(node, constants)
                    if len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
                        api_version, kind = str(args[0]), str(args[1])
                sites.append(Site(module, node.lineno, node.func.attr, api_version, kind))
    return tuple(sites)


def module_exists(module: str) -> bool:
    return Path(ROOT / module).is_file()

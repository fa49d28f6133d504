"""What the API holds of this node's pool: its ResourceSlices.

The agent writes its slices and then has no reason to look at them again, unless someone else
changed them: the garbage collector deletes them with their Node (they carry the Node as owner,
so that a node removed for good takes its pool along), and an admin may delete them by hand. A
node deleted and registered again by its kubelet has a new uid, and nothing of the agent's own
view changes. Without a look at the API the pool would stay gone, and no pod could be scheduled
on the node, until something else made the agent publish.

So the agent watches its slices, narrowed to this node by a field selector (``spec.nodeName``:
the apiserver filters, so each agent receives only its own events), and :meth:`PoolWatch.key`
joins the reconciler's publish key: when the slices of gpu-slicer's drivers on this node change
(one deleted, one added), the reconciler hands the publisher its view again, which writes what
is missing, owned by the Node as it is now (none while it is gone), and finds the rest
unchanged. While the Node is gone the publisher looks for it every few seconds
(``slicer.publisher.NODE_LOOK_AGAIN_S``) and writes the slices again for a Node registered
anew: reading Nodes as they change would take list and watch on every Node of the cluster.
"""

from __future__ import annotations

from collections.abc import Callable

from gpu_slicer.core.identity import DRIVERS, RESOURCE_API
from gpu_slicer.kube.api import KubeApi, Obj
from gpu_slicer.kube.watch_cache import WatchCache


class PoolWatch:
    """The names of this node's slices of gpu-slicer's drivers, kept current."""

    def __init__(
        self,
        api: KubeApi,
        node: str,
        *,
        on_change: Callable[[], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        watch_timeout_s: float = 300.0,
    ) -> None:
        self._slices: WatchCache[str] = WatchCache(
            api,
            RESOURCE_API,
            "ResourceSlice",
            _driver,
            field_selector=f"spec.nodeName={node}",
            on_change=on_change,
            on_error=on_error,
            watch_timeout_s=watch_timeout_s,
        )

    def key(self) -> frozenset[str]:
        """The names of this node's slices of gpu-slicer's drivers: a republish is due
        whenever they change."""
        return frozenset(name for (_, name), driver in self._slices.items() if driver in DRIVERS)

    def start(self) -> None:
        self._slices.start()

    def stop(self) -> None:
        self._slices.stop(timeout_s=1)

    def sync_once(self) -> None:
        """List once (without the watch thread): tests."""
        self._slices.relist()


def _driver(obj: Obj) -> str:
    return str(obj.get("spec", {}).get("driver") or "")

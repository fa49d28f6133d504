"""A pod on a real node that reports from inside its container what it was given.

Its busybox lists the NVIDIA device nodes it can open, its ``NVIDIA_VISIBLE_DEVICES`` and its
device cgroup (cgroup v1), then sleeps; the real-node tests compare that with the claim's CDI
spec.
"""

from __future__ import annotations

from tests.support.e2e_sandbox import ENABLED, Obj, Sandbox, pod_manifest

SCRIPT = r"""
for f in /dev/nvidia* /dev/nvidia-caps/*; do
  if [ -c "$f" ]; then echo "DEV $f"; fi
done
echo "ENV NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"
if [ -r /sys/fs/cgroup/devices/devices.list ]; then
  sed 's/^/CGROUP /' /sys/fs/cgroup/devices/devices.list
fi
echo END
exec sleep 2147483647
"""


def probe_pod(name: str, node: str, limits: dict[str, str]) -> Obj:
    """A converted-to-be pod on ``node`` whose busybox reports what it sees, then sleeps."""
    pod = pod_manifest(name, node=node, limits=limits)
    pod["spec"]["containers"][0] |= {
        "image": "busybox:sandbox",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", SCRIPT],
    }
    return pod


def container_report(box: Sandbox, name: str) -> Obj:
    """What the container reported from inside: its device nodes, env, device cgroup."""

    def report() -> str | None:
        text = str(box.core.read_namespaced_pod_log(name, ENABLED))
        return text if "END" in text.split() else None

    text: str = box.wait(report, what=f"{name}'s report from inside its container", timeout_s=90)
    lines = text.splitlines()
    return {
        "devices": {line.split()[1] for line in lines if line.startswith("DEV ")},
        "env": next(line.split(" ", 1)[1] for line in lines if line.startswith("ENV ")),
        "cgroup": {line.split(" ", 1)[1] for line in lines if line.startswith("CGROUP ")},
    }

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


REPEATING = (
    'n=0\nwhile true; do\n  n=$((n + 1)); echo "SEQ $n"\n'
    + SCRIPT.split("exec sleep", 1)[0]
    + "  sleep 2\ndone\n"
)
"""The same report every 2 s, numbered (``SEQ n``): what the container sees *now*."""


def probe_pod(name: str, node: str, limits: dict[str, str], *, repeat: bool = False) -> Obj:
    """A converted-to-be pod on ``node`` whose busybox reports what it sees, then sleeps
    (``repeat``: reports again every 2 s, for :func:`latest_report`)."""
    pod = pod_manifest(name, node=node, limits=limits)
    pod["spec"]["containers"][0] |= {
        "image": "busybox:sandbox",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", REPEATING if repeat else SCRIPT],
    }
    return pod


def _parse(lines: list[str]) -> Obj:
    return {
        "devices": {line.split()[1] for line in lines if line.startswith("DEV ")},
        "env": next(line.split(" ", 1)[1] for line in lines if line.startswith("ENV ")),
        "cgroup": {line.split(" ", 1)[1] for line in lines if line.startswith("CGROUP ")},
    }


def latest_report(box: Sandbox, name: str, namespace: str, after: int = 0) -> tuple[int, Obj]:
    """The newest complete report of a ``repeat`` probe, numbered above ``after``: its number
    and what the container saw then."""

    def newest() -> tuple[int, Obj] | None:
        text = str(box.core.read_namespaced_pod_log(name, namespace, tail_lines=200))
        blocks = text.split("\nEND\n")[:-1]  # complete reports only
        if not blocks or "SEQ " not in blocks[-1]:
            return None
        block = blocks[-1].rsplit("SEQ ", 1)[1]
        number, _, rest = block.partition("\n")
        return (int(number), _parse(rest.splitlines())) if int(number) > after else None

    found: tuple[int, Obj] = box.wait(
        newest, what=f"a report from inside {namespace}/{name} after #{after}", timeout_s=90
    )
    return found


def container_report(box: Sandbox, name: str) -> Obj:
    """What the container reported from inside: its device nodes, env, device cgroup."""

    def report() -> str | None:
        text = str(box.core.read_namespaced_pod_log(name, ENABLED))
        return text if "END" in text.split() else None

    text: str = box.wait(report, what=f"{name}'s report from inside its container", timeout_s=90)
    return _parse(text.splitlines())

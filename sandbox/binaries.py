"""The control-plane binaries: built from the Kubernetes Go modules into a cache, or the user's.

Nothing upstream is vendored: ``sandbox/go/kube`` is a small module that requires
``k8s.io/kubernetes`` at the pinned release (each ``k8s.io/*`` staging module replaced by its
matching ``v0.<minor>.<patch>``, as the release's own go.mod lists them) and ``go build``
compiles ``cmd/kube-apiserver``, ``cmd/kube-scheduler`` and ``cmd/kube-controller-manager`` from
the module cache. Other releases get the same module, re-pinned in the cache folder, with the
replace list derived from that release's go.mod. Our own helpers (an embedded etcd 3.6 and the
CDI checker) are built from the committed module.

Layout of the cache (``$GPU_SLICER_CACHE``, else ``$XDG_CACHE_HOME/gpu-slicer``, else
``~/.cache/gpu-slicer``)::

    kube/v1.36.3/{kube-apiserver,kube-scheduler,kube-controller-manager}
    tools/<hash of our Go sources>/{etcd,cdi-inject}
    kubelet/v1.36.3/kubelet                      the real node's (same module and release)
    kubectl/v1.36.3/kubectl                      an admin's (same module and release)
    containerd/v2.4.2/{containerd,containerd-shim-runc-v2,ctr}   ``sandbox/go/containerd``

A folder is complete when its ``build.json`` exists; builds go to a temporary folder renamed into
place, under a file lock, so two builds never mix and an interrupted one leaves nothing behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpu_slicer.sandbox.errors import BuildError, UsageError

Progress = Callable[[str], None]

RELEASES = {"1.35": "v1.35.4", "1.36": "v1.36.3", "1.37": "v1.37.2", "1.38": "v1.38.0-beta.0"}
"""The release built for each minor version: the supported ones, and 1.38 as a preview (its
newest release on the module proxy is a beta) for the scheduler benchmark and ``sandbox up``."""
PREVIEW = frozenset({"1.38"})
"""Minor versions built for measurement, not yet supported (no schemas, not in the test tiers)."""
NEWER_GO = {"1.27": "go1.27.3"}
"""The Go toolchain the go command fetches through the module proxy (``GOTOOLCHAIN``) when a
release's go.mod needs a newer Go than the one installed (Kubernetes 1.38 needs Go 1.27)."""
DEFAULT_MINOR = "1.36"
PINNED = RELEASES[DEFAULT_MINOR]
"""The release ``sandbox/go/go.mod`` requires; others are re-pinned in the cache."""

KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
TOOL_COMMANDS = ("etcd", "cdi-inject")
GO_DIR = Path(__file__).with_name("go")
KUBE_MODULE = GO_DIR / "kube"
"""Requires k8s.io/kubernetes only: nothing of ours changes how the control plane builds."""
HELPERS_MODULE = GO_DIR / "helpers"
CONTAINERD_MODULE = GO_DIR / "containerd"
"""Pins containerd 2.x (CDI built in); its own module, so its dependencies never meet ours."""
CONTAINERD_PACKAGE = "github.com/containerd/containerd/v2"
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")
CONTAINERD_TAGS = "no_btrfs no_devmapper"
"""Leaves out the snapshotters that need C headers; the real node uses overlayfs."""
_STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", re.M)
_GO_LINE = re.compile(r"^go\s+(\d+\.\d+)(?:\.\d+)?\s*$", re.M)


def cache_root() -> Path:
    explicit = os.environ.get("GPU_SLICER_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpu-slicer"


def release_for(version: str) -> str:
    """``1.36`` or ``v1.36.3`` -> the release to build; anything else is a usage error."""
    text = version.strip().removeprefix("v")
    if text in RELEASES:
        return RELEASES[text]
    if "v" + text in RELEASES.values():
        return "v" + text
    if re.fullmatch(r"1\.\d+\.\d+", text):
        minor = text.rsplit(".", 1)[0]
        if minor in RELEASES:
            return "v" + text
    supported = ", ".join(RELEASES)
    raise UsageError(f"--k8s-version {version!r} is not supported; use one of {supported}")


def describe_releases() -> str:
    """``1.35, 1.36, 1.37, 1.38 (preview: v1.38.0-beta.0)``: the choices, for help texts."""
    return ", ".join(
        f"{minor} (preview: {release})" if minor in PREVIEW else minor
        for minor, release in RELEASES.items()
    )


def minor_of(release: str) -> int:
    """``v1.36.3`` -> 36 (``v1.38.0-beta.0`` -> 38)."""
    return int(release.removeprefix("v").split(".")[1])


@dataclass(frozen=True)
class Binaries:
    """Where each command of the sandbox lives."""

    kube_dir: Path
    tools_dir: Path
    release: str

    def path(self, command: str) -> Path:
        folder = self.tools_dir if command in TOOL_COMMANDS else self.kube_dir
        return folder / command


def ensure(
    version: str = DEFAULT_MINOR,
    *,
    kube_bin: Path | None = None,
    cache: Path | None = None,
    progress: Progress = print,
) -> Binaries:
    """The binaries for ``version``, building what the cache lacks."""
    release = release_for(version)
    cache = cache or cache_root()
    if kube_bin is not None:
        kube_dir = _check_user_dir(kube_bin)
    else:
        kube_dir = _ensure_kube(release, cache, progress)
    tools_dir = _ensure_tools(cache, progress)
    return Binaries(kube_dir=kube_dir, tools_dir=tools_dir, release=release)


STANDALONE_COMMANDS = ("kubelet", "kubectl")
"""Commands built alone from the control plane's module: the real node's kubelet, and the
kubectl the end-to-end tests run as an admin would (``kubectl drain``, ``kubectl delete -k``)."""


def ensure_command(
    command: str,
    version: str = DEFAULT_MINOR,
    *,
    cache: Path | None = None,
    progress: Progress = print,
) -> Path:
    """``command`` (one of :data:`STANDALONE_COMMANDS`) of ``version``, from the control plane's
    module (cached or built now) into ``<command>/<release>/``."""
    if command not in STANDALONE_COMMANDS:
        raise UsageError(f"{command!r} is not built alone; one of {', '.join(STANDALONE_COMMANDS)}")
    release = release_for(version)
    cache = cache or cache_root()

    def build(go: str, target: Path) -> None:
        _build_kube_commands(go, release, [command], target, f"{command} {release}", progress)

    return build_once(cache / command / release, build) / command


def containerd_version() -> str:
    """The containerd release ``sandbox/go/containerd/go.mod`` pins."""
    text = (CONTAINERD_MODULE / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(CONTAINERD_PACKAGE)}\s+(v\S+)", text, re.M)
    if match is None:
        raise BuildError(f"{CONTAINERD_MODULE / 'go.mod'} does not require {CONTAINERD_PACKAGE}")
    return match.group(1)


def ensure_containerd(*, cache: Path | None = None, progress: Progress = print) -> Path:
    """The folder with containerd, its runc shim and ctr (cached or built now)."""
    version = containerd_version()

    def build(go: str, target: Path) -> None:
        _build(
            go,
            CONTAINERD_MODULE,
            [f"{CONTAINERD_PACKAGE}/cmd/{c}" for c in CONTAINERD_COMMANDS],
            target,
            f"-s -w -X {CONTAINERD_PACKAGE}/version.Version={version}",
            f"containerd {version}",
            progress,
            extra={"release": version},
            tags=CONTAINERD_TAGS,
        )

    return build_once((cache or cache_root()) / "containerd" / version, build)


def _check_user_dir(folder: Path) -> Path:
    missing = [c for c in KUBE_COMMANDS if not os.access(folder / c, os.X_OK)]
    if not folder.is_dir() or missing:
        raise UsageError(
            f"--kube-bin {folder}: needs executable {', '.join(missing or KUBE_COMMANDS)}"
            " (for example the 'server/bin' folder of the official server release)"
        )
    return folder


def go_toolchain() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "Go (1.26 or newer) is not on the PATH: install it to build the control plane,"
            " or pass --kube-bin DIR with kube-apiserver, kube-scheduler and"
            " kube-controller-manager"
        )
    return go


def _ensure_kube(release: str, cache: Path, progress: Progress) -> Path:
    def build(go: str, target: Path) -> None:
        what = f"Kubernetes {release} control plane"
        _build_kube_commands(go, release, list(KUBE_COMMANDS), target, what, progress)

    return build_once(cache / "kube" / release, build)


def _build_kube_commands(
    go: str, release: str, commands: list[str], target: Path, what: str, progress: Progress
) -> None:
    """``k8s.io/kubernetes/cmd/<command>`` of ``release`` from our module (re-pinned if needed)."""
    work = target.parent / f".{release}.module"
    env: dict[str, str] = {}
    if release == PINNED:
        module = KUBE_MODULE
    else:
        module, env = _repinned_module(go, release, commands, work, progress)
    _build(
        go,
        module,
        [f"k8s.io/kubernetes/cmd/{c}" for c in commands],
        target,
        _version_ldflags(release),
        what,
        progress,
        extra={"release": release},
        env=env,
    )
    shutil.rmtree(work, ignore_errors=True)


def _ensure_tools(cache: Path, progress: Progress) -> Path:
    def build(go: str, target: Path) -> None:
        packages = [f"./cmd/{c}" for c in TOOL_COMMANDS]
        _build(
            go,
            HELPERS_MODULE,
            packages,
            target,
            "",
            "sandbox helpers (etcd, cdi-inject)",
            progress,
            extra={},
        )

    return build_once(cache / "tools" / _sources_digest(), build)


def build_once(target: Path, build: Callable[[str, Path], None]) -> Path:
    """``target`` once complete (its build.json exists), built under the lock if it is not."""
    if (target / "build.json").exists():
        return target
    with locked(target):
        if not (target / "build.json").exists():
            build(go_toolchain(), target)
    return target


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(HELPERS_MODULE.rglob("*")):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
            digest.update(str(path.relative_to(HELPERS_MODULE)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _version_ldflags(release: str) -> str:
    major, minor, _ = release.removeprefix("v").split(".", 2)
    prefix = "k8s.io/component-base/version"
    return " ".join(
        [
            "-s",
            "-w",
            f"-X {prefix}.gitVersion={release}",
            f"-X {prefix}.gitMajor={major}",
            f"-X {prefix}.gitMinor={minor}",
            f"-X {prefix}.gitTreeState=clean",
        ]
    )


def staging_modules(go_mod_text: str) -> list[str]:
    """The staging modules a release's go.mod replaces with ``./staging/src/...``."""
    return _STAGING.findall(go_mod_text)


def _repinned_module(
    go: str, release: str, commands: list[str], work: Path, progress: Progress
) -> tuple[Path, dict[str, str]]:
    """Our module requiring ``release`` with that release's staging replaces and only
    ``commands`` imported (so one command's dependencies missing from the proxy never block
    another's), and the environment its go commands need (a newer toolchain where the release
    asks for one)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    progress(f"resolving k8s.io/kubernetes@{release} through the Go module proxy")
    command = [go, "mod", "download", "-json", f"k8s.io/kubernetes@{release}"]
    info = _run_json(command, work, {"GOTOOLCHAIN": "local"})
    env = toolchain_env(info.get("Error", ""))
    if env:
        info = _run_json(command, work, env)
    if info.get("Error"):
        raise BuildError(f"the module proxy refused k8s.io/kubernetes@{release}: {info['Error']}")
    go_mod = Path(info["GoMod"]).read_text()
    staging = staging_modules(go_mod)
    staged = "v0." + release.removeprefix("v1.")
    go_line = _GO_LINE.search(go_mod)
    (work / "tools.go").write_text(
        "//go:build tools\n\npackage tools\n\nimport (\n"
        + "".join(f'\t_ "k8s.io/kubernetes/cmd/{c}"\n' for c in commands)
        + ")\n"
    )
    (work / "go.mod").write_text(
        f"module gpu-slicer.local/sandbox\n\ngo {go_line.group(1) if go_line else '1.26'}.0\n\n"
        f"require k8s.io/kubernetes {release}\n\n"
        + "".join(f"replace {m} => {m} {staged}\n" for m in staging)
    )
    _run([go, "mod", "tidy"], work, f"go mod tidy for {release}", env)
    return work, env


_NEEDS_GO = re.compile(r"requires go >= (\d+\.\d+)")


def toolchain_env(error: str) -> dict[str, str]:
    """``GOTOOLCHAIN`` for a module the installed Go refused as too new ("requires go >=
    1.27.0 (running go 1.26.8; ...)"), from :data:`NEWER_GO`; empty when nothing was refused
    for that reason."""
    needed = _NEEDS_GO.search(error)
    if needed is None:
        return {}
    minor = needed.group(1)
    toolchain = NEWER_GO.get(minor)
    if toolchain is None:
        raise BuildError(
            f"this release needs Go {minor} or newer: install it, or pass --kube-bin DIR with"
            f" the release's binaries (go: {error.strip()})"
        )
    return {"GOTOOLCHAIN": toolchain}


def _build(
    go: str,
    module: Path,
    packages: list[str],
    target: Path,
    ldflags: str,
    what: str,
    progress: Progress,
    *,
    extra: dict[str, str],
    tags: str = "",
    env: dict[str, str] | None = None,
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        started = time.monotonic()
        progress(
            f"building {what} into {target} (cold: tens of minutes on 2 cores; cached afterwards)"
        )
        command = [
            go,
            "build",
            "-v",
            "-trimpath",
            "-buildvcs=false",
            "-mod=readonly",
            "-o",
            str(staging) + "/",
        ]
        if ldflags:
            command += ["-ldflags", ldflags]
        if tags:
            command += ["-tags", tags]
        environment = _environ({"CGO_ENABLED": "0", **(env or {})})
        _run_with_progress(command + packages, module, environment, what, progress)
        elapsed = install(go, staging, target, started, extra, environment)
        progress(f"built {what} in {elapsed / 60:.1f} min")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def install(
    go: str,
    staging: Path,
    target: Path,
    started: float,
    extra: dict[str, str],
    env: dict[str, str] | None = None,
) -> float:
    """Mark a finished build complete (``build.json``) and move it into place; its seconds."""
    elapsed = time.monotonic() - started
    (staging / "build.json").write_text(
        json.dumps(
            {
                **extra,
                "go": _go_version(go, env),
                "seconds": round(elapsed, 1),
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
        )
        + "\n"
    )
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return elapsed


def _run_with_progress(
    command: list[str], cwd: Path, env: dict[str, str], what: str, progress: Progress
) -> None:
    """Runs ``go build -v``, reporting how many packages it compiled every 20 seconds."""
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    compiled = 0
    tail: list[str] = []
    done = threading.Event()
    started = time.monotonic()

    def report() -> None:
        while not done.wait(20):
            minutes = (time.monotonic() - started) / 60
            progress(f"  {what}: {compiled} packages compiled ({minutes:.1f} min)")

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    assert process.stderr is not None
    try:
        for line in process.stderr:
            compiled += 1
            tail = (tail + [line.rstrip()])[-20:]
        code = process.wait()
    finally:
        done.set()
        if process.poll() is None:
            process.kill()
            process.wait()
    if code != 0:
        raise BuildError(f"building {what} failed (go build exit {code}):\n" + "\n".join(tail))


def _environ(env: dict[str, str] | None) -> dict[str, str]:
    """This process's environment with ``env`` (a release's toolchain) on top."""
    return dict(os.environ, **(env or {}))


def _run(command: list[str], cwd: Path, what: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=_environ(env))
    if result.returncode != 0:
        raise BuildError(f"{what} failed: {result.stderr.strip()[-2000:]}")
    return result.stdout


def _run_json(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=_environ(env))
    try:
        data: dict[str, str] = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise BuildError(f"{' '.join(command[1:])} failed: {result.stderr.strip()}") from exc
    return data


def _go_version(go: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, env=_environ(env)
    )
    return result.stdout.strip()


@contextmanager
def locked(target: Path) -> Iterator[None]:
    """One build of ``target`` at a time, across processes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

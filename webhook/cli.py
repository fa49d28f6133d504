"""Subcommands of the webhook package.

``convert`` and ``policy check`` work offline on files (``-`` reads stdin); they exit 2 with a
message naming the problem when the input is bad.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from gpu_slicer.kube import documents

if TYPE_CHECKING:
    from gpu_slicer.webhook import tree_files
    from gpu_slicer.webhook.gitops import Tree
    from gpu_slicer.webhook.policy import Policy


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds this package's subcommands."""
    _register_convert(subparsers)
    _register_policy(subparsers)
    _register_serve(subparsers)


# --- convert / policy check (translation core) ----------------------------------------------


def _register_convert(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert manifests with legacy GPU requests to DRA claims (offline)",
        description=(
            "Apply the webhook's translation to every pod template of Pods, Kubernetes' "
            "workloads and operators' kinds whose CRDs keep the claim (Kubeflow, KubeRay, "
            "JobSet, LeaderWorkerSet, KServe; others when the policy's workloads opt them in; "
            "matched by API group and kind), in multi-document input. Prints the objects, "
            "converted where they ask for GPUs, and the ResourceClaimTemplates they need, each "
            "once. Documents without GPU requests are kept as they were written. A document "
            "that cannot be converted is named and kept as it was. Exit 0: every document "
            "converted or left with a stated reason; 1: some could not be converted (named on "
            "stderr, the rest written); 2: bad flags, policy or input file. Reading a "
            "ResourceList on stdin, it answers as a kustomize KRM function."
        ),
    )
    parser.add_argument(
        "file",
        metavar="FILE|DIR",
        help="YAML or JSON manifests; '-' reads stdin; a folder is read recursively (every "
        ".yaml, .yml and .json file; hidden files and folders, a Helm chart's templates/ and "
        "--beside outputs are not read, symlinks are not followed)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--out-dir",
        metavar="DIR",
        help="with a folder: write the whole tree to DIR, converted files changed where they ask "
        "for GPUs (same names, formats and modes, comments kept), every other file copied "
        "(.git left out), symlinks inside the tree recreated; each file written whole",
    )
    where.add_argument(
        "--beside",
        action="store_true",
        help="with a folder: write each converted file next to its source as "
        "<name>.gpu-slicer.yaml (or .json)",
    )
    parser.add_argument("--policy", metavar="FILE", help="policy file (default: built-in policy)")
    parser.add_argument(
        "--mode",
        choices=["enabled", "audit"],
        default="enabled",
        help="enabled: convert; audit: print the objects unchanged, report on stderr",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=["yaml", "json"],
        default="yaml",
        help="format of what is printed or written --beside (default yaml); --out-dir keeps "
        "each file's format",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="namespace for objects that name none (also selects the policy's namespace rules)",
    )
    parser.add_argument(
        "--native-extended",
        default="",
        metavar="NAMES",
        help="comma-separated legacy names a DeviceClass serves through extendedResourceName "
        "(DeviceClasses in the input count without it)",
    )
    parser.set_defaults(func=_convert)


def _register_policy(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("policy", help="work with webhook policy files")
    policy_sub = parser.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    check = policy_sub.add_parser(
        "check",
        help="validate a policy file (exit 2 and the problems when invalid)",
    )
    check.add_argument("file", metavar="FILE", help="policy YAML; '-' reads stdin")
    check.set_defaults(func=_policy_check)


_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _report(heading: str, problems: list[str]) -> int:
    """Prints a bad input's problems under ``heading`` on stderr; the exit code for bad input."""
    print(heading, file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    return 2


def _policy_check(args: argparse.Namespace) -> int:
    from gpu_slicer.webhook.errors import PolicyError
    from gpu_slicer.webhook.policy import load_policy

    source = "<stdin>" if args.file == "-" else args.file
    try:
        policy = load_policy(documents.read_text(args.file), source=source)
    except documents.DocumentError as exc:
        print(f"{source}: {exc}", file=sys.stderr)
        return 2
    except PolicyError as exc:
        count = len(exc.problems)
        return _report(
            f"{source}: invalid policy ({count} problem{'s' if count != 1 else ''}):", exc.problems
        )
    print(f"{source}: valid: {policy.describe()}")
    return 0


_CONVERT = "gpu-slicer convert"
"""How ``convert``'s messages begin."""


def _convert(args: argparse.Namespace) -> int:
    """Exit 0: every document converted or left with a stated reason; 1: some documents (or
    files) could not be converted, read or written, each named, and the rest written; 2: bad
    flags, policy or input."""
    from gpu_slicer.webhook import gitops, krm
    from gpu_slicer.webhook.errors import FunctionConfigError, ManifestError, PolicyError
    from gpu_slicer.webhook.policy import Policy, load_policy_file

    try:
        policy = load_policy_file(args.policy) if args.policy else Policy.default()
    except PolicyError as exc:
        return _report(f"{_CONVERT}: invalid policy {exc.source}:", exc.problems)
    folder = Path(args.file) if args.file != "-" and Path(args.file).is_dir() else None
    problem = _convert_usage_problem(args, folder)
    if problem is None and folder is not None:
        return _convert_folder(args, folder, policy)
    if problem is not None:
        print(f"{_CONVERT}: {problem}", file=sys.stderr)
        return 2
    try:
        source = "<stdin>" if args.file == "-" else args.file
        text = documents.read_text(args.file)
    except documents.DocumentError as exc:
        print(f"{_CONVERT}: {source}: {exc}", file=sys.stderr)
        return 2
    native = _native(args)
    if args.file == "-" and krm.is_resource_list(text):
        try:
            sys.stdout.write(krm.run(text, policy=policy, native_extended=native))
        except (FunctionConfigError, ManifestError) as exc:
            print(f"{_CONVERT}: {exc}", file=sys.stderr)
            return 2
        return 0
    name = "stdin.yaml" if args.file == "-" else Path(args.file).name
    tree = gitops.convert_tree(
        [(PurePosixPath(name), text)],
        policy=policy,
        mode=args.mode,
        namespace=args.namespace,
        native_extended=native,
        read_all=args.output == "json",
    )
    for note in tree.notes:
        print(note.split(": ", 1)[1], file=sys.stderr)
    for found in tree.problems:
        print(f"{_CONVERT}: {source}: {found.partition(': ')[2]}", file=sys.stderr)
    _print_tree(args, tree)
    return 1 if tree.problems else 0


def _native(args: argparse.Namespace) -> frozenset[str]:
    return frozenset(n.strip() for n in args.native_extended.split(",") if n.strip())


def _convert_folder(args: argparse.Namespace, folder: Path, policy: Policy) -> int:
    """``convert DIR``: the tree walked without following symlinks (webhook.tree_files), each
    manifest read, converted and printed or written; every file that cannot be read, converted
    or written is named and the rest proceeds."""
    from gpu_slicer.webhook import gitops, tree_files
    from gpu_slicer.webhook.errors import TreeFileError

    out = Path(args.out_dir) if args.out_dir else None
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"{_CONVERT}: --out-dir {out}: cannot create: {exc.strerror}", file=sys.stderr)
            return 2
        if not os.access(out, os.W_OK):
            print(f"{_CONVERT}: --out-dir {out} is not writable", file=sys.stderr)
            return 2
    walked = tree_files.walk(folder, out)
    if not walked.manifests:
        print(f"{_CONVERT}: {folder} holds no .yaml, .yml or .json files", file=sys.stderr)
        return 2
    problems: list[str] = []
    sources: list[tuple[PurePosixPath, str]] = []
    modes: dict[PurePosixPath, int] = {}
    for relative in walked.manifests:
        try:
            text, modes[relative] = tree_files.read_text(folder, relative)
        except TreeFileError as exc:
            problems.append(f"{folder / relative}: {exc.message}")
            continue
        sources.append((relative, text))
    tree = gitops.convert_tree(
        sources,
        policy=policy,
        mode=args.mode,
        namespace=args.namespace,
        native_extended=_native(args),
        read_all=args.output == "json",
    )
    for line in [*walked.warnings, *walked.notes, *tree.notes]:
        print(line, file=sys.stderr)
    problems += [
        f"{folder / r}: {rest}" for r, _, rest in (p.partition(": ") for p in tree.problems)
    ]
    if out is not None:
        problems += _write_out_dir(out, folder, walked, tree, modes)
    elif args.beside:
        problems += _write_beside(args, folder, tree, modes)
    else:
        _print_tree(args, tree, folder=True)
    for found in problems:
        print(f"{_CONVERT}: {found}", file=sys.stderr)
    return 1 if problems else 0


def _convert_usage_problem(args: argparse.Namespace, folder: Path | None) -> str | None:
    """What is wrong with ``convert``'s flags, found before any file is read."""
    if args.namespace is not None and not _NAMESPACE.fullmatch(args.namespace):
        return (
            f"--namespace {args.namespace!r} is not a valid namespace name: at most "
            "63 lower-case letters, digits and '-', starting and ending with a letter or digit"
        )
    if (args.out_dir or args.beside) and folder is None:
        return (
            "--out-dir and --beside write one file per input file: give a folder "
            "(FILE writes to standard output)"
        )
    if args.out_dir and Path(args.out_dir).exists() and not Path(args.out_dir).is_dir():
        return f"--out-dir {args.out_dir} is a file, not a folder"
    if args.out_dir and folder is not None and Path(args.out_dir).resolve() == folder.resolve():
        return "--out-dir is the folder being converted: use --beside, or another folder"
    return None


def _print_tree(args: argparse.Namespace, tree: Tree, *, folder: bool = False) -> None:
    """The converted stream on standard output: files that could not be read as YAML are left
    out (they are named on stderr), and so are, from a folder, a kustomization and a Helm
    chart's Chart.yaml and values (named too), so that the stream stays valid for kubectl
    apply."""
    from gpu_slicer.webhook import convert

    not_objects = tree.not_objects() if folder else {}
    for relative, what in not_objects.items():
        print(
            f"{relative}: left out of the printed stream: {what}, not a Kubernetes object "
            "(--out-dir writes it with the tree)",
            file=sys.stderr,
        )
    readable = [f for f in tree.files if f.error is None and f.relative not in not_objects]
    if args.output == "json":
        items = [i for f in readable if f.result is not None for i in f.result.items]
        sys.stdout.write(convert.dump_json_list(items))
        return
    texts = [f.output if f.output is not None else f.text for f in readable]
    texts += list(tree.added.values())
    sys.stdout.write(_join(texts))


def _write_beside(
    args: argparse.Namespace, folder: Path, tree: Tree, modes: dict[PurePosixPath, int]
) -> list[str]:
    """Each changed file's conversion next to it (``<name>.gpu-slicer.<ext>``); the problems."""
    from gpu_slicer.webhook import convert, tree_files
    from gpu_slicer.webhook.errors import TreeFileError

    changed: dict[PurePosixPath, str] = {
        f.relative: f.output for f in tree.changed() if f.output is not None
    }
    if args.output == "json":
        changed = {
            f.relative.with_suffix(".json"): convert.dump_json_list(f.result.items)
            for f in tree.changed()
            if f.result is not None
        }
    sources = {
        f.relative.with_suffix(".json") if args.output == "json" else f.relative: f.relative
        for f in tree.changed()
    }
    writer = tree_files.Writer(folder)
    problems: list[str] = []
    default = tree_files.default_mode()
    for relative, text in [*changed.items(), *tree.added.items()]:
        source = sources.get(relative)
        try:
            if source is not None:
                tree_files.still_there(folder, source)
            target = writer.write(
                tree_files.beside_name(relative),
                text.encode("utf-8"),
                modes.get(source, default) if source is not None else default,
            )
        except TreeFileError as exc:
            problems.append(f"{folder / (source or relative)}: {exc.message}")
            continue
        print(f"wrote {target}", file=sys.stderr)
    for file in tree.files:
        if file.output is None and file.error is None:
            print(f"unchanged: {file.relative}", file=sys.stderr)
    return problems


def _write_out_dir(
    out: Path,
    folder: Path,
    walked: tree_files.Walk,
    tree: Tree,
    modes: dict[PurePosixPath, int],
) -> list[str]:
    """The whole tree under ``out``: converted files, the others copied with their modes, the
    symlinks that stay in the tree recreated, the added files; the problems."""
    from gpu_slicer.webhook import tree_files
    from gpu_slicer.webhook.errors import TreeFileError

    converted = {f.relative: f.output for f in tree.files if f.output is not None}
    read = {f.relative for f in tree.files}
    writer = tree_files.Writer(out)
    problems: list[str] = []
    for relative in sorted([*walked.manifests, *walked.others]):
        if relative in walked.manifests and relative not in read:
            continue  # could not be read: named already
        try:
            if relative in converted:
                tree_files.still_there(folder, relative)
                data, mode = (converted[relative] or "").encode("utf-8"), modes[relative]
            else:
                data, mode = tree_files.read(folder, relative)
            target = writer.write(relative, data, mode)
        except TreeFileError as exc:
            problems.append(f"{folder / relative}: {exc.message}")
            continue
        if relative in converted:
            print(f"wrote {target}", file=sys.stderr)
    for relative, pointing_to in walked.links.items():
        try:
            writer.link(relative, pointing_to)
        except TreeFileError as exc:
            problems.append(f"{folder / relative}: {exc.message}")
    default = tree_files.default_mode()
    for relative, text in tree.added.items():
        try:
            target = writer.write(relative, text.encode("utf-8"), default)
        except TreeFileError as exc:
            problems.append(f"{out / relative}: {exc.message}")
            continue
        print(f"wrote {target}", file=sys.stderr)
    for file in tree.files:
        if file.output is None and file.error is None:
            print(f"unchanged: {file.relative}", file=sys.stderr)
    return problems


def _join(texts: list[str]) -> str:
    """Streams one after the other, each starting a new document (joined once: adding each
    to the stream so far would copy it again and again)."""
    parts: list[str] = []
    for text in texts:
        if not text.strip():
            continue
        if parts:  # a byte-order mark belongs at the start of the stream only
            text = text.removeprefix("\ufeff")
            if not parts[-1].endswith("\n"):
                parts.append("\n")
            if not text.lstrip().startswith("---"):
                parts.append("---\n")
        parts.append(text)
    return "".join(parts)


# --- webhook serve (admission server) --------------------------------------------------------


def _register_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("webhook", help="run the admission webhook")
    webhook_sub = parser.add_subparsers(dest="webhook_command", metavar="ACTION", required=True)
    serve = webhook_sub.add_parser(
        "serve",
        help="serve POST /mutate-pods over TLS with gunicorn",
        description=(
            "Run the mutating admission webhook. Every flag has an environment twin "
            "GPU_SLICER_<FLAG> (e.g. GPU_SLICER_TLS_CERT); flags win over the environment, "
            "which wins over --config. --dev makes a self-signed certificate and runs without "
            "a cluster: every namespace is in --namespace-mode (default enabled) and templates "
            "are reported, not created."
        ),
    )
    serve.add_argument("--config", metavar="FILE", help="YAML file of settings (GPU_SLICER_CONFIG)")
    serve.add_argument("--bind", metavar="HOST:PORT", help="listen address (default 0.0.0.0:8443)")
    serve.add_argument("--tls-cert", metavar="FILE", help="serving certificate (PEM)")
    serve.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    serve.add_argument(
        "--dev",
        action="store_true",
        default=None,
        help="self-signed certificate, no cluster: for trying the webhook locally",
    )
    serve.add_argument("--policy", metavar="FILE", help="policy YAML (default: built-in policy)")
    serve.add_argument("--workers", type=int, metavar="N", help="gunicorn worker processes")
    serve.add_argument(
        "--connections",
        type=int,
        metavar="N",
        help="connections each worker serves at once (default 1000)",
    )
    serve.add_argument(
        "--client-ca",
        metavar="FILE",
        help="CA bundle (PEM): require client certificates it signed (mutual TLS with the "
        "apiserver)",
    )
    serve.add_argument("--kubeconfig", metavar="FILE", help="default: in-cluster credentials")
    serve.add_argument(
        "--namespace-mode",
        choices=["enabled", "audit"],
        help="with --dev: the mode of every namespace (default enabled)",
    )
    serve.set_defaults(func=_serve)


def _tls_file_problems(cert: str | None, key: str | None, client_ca: str | None) -> list[str]:
    """Missing or unreadable certificate files, named before anything contacts a cluster."""
    found: list[str] = []
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--client-ca", client_ca)):
        if not path:
            continue
        file = Path(path)
        if not file.exists():
            found.append(f"{flag} {path}: cannot load: no such file")
        elif not file.is_file():
            found.append(f"{flag} {path}: cannot load: not a file")
        elif file.stat().st_size == 0:
            found.append(f"{flag} {path}: cannot load: the file is empty (expected PEM)")
        elif not os.access(file, os.R_OK):
            found.append(f"{flag} {path}: cannot load: not readable")
    return found


_SERVE_FLAGS = (
    "bind",
    "tls_cert",
    "tls_key",
    "dev",
    "policy",
    "workers",
    "connections",
    "client_ca",
    "kubeconfig",
    "namespace_mode",
)


def _serve(args: argparse.Namespace) -> int:
    from gpu_slicer.webhook.config import ConfigError, ServerConfig
    from gpu_slicer.webhook.errors import PolicyError
    from gpu_slicer.webhook.server import serve

    flags = {name: getattr(args, name) for name in _SERVE_FLAGS if getattr(args, name) is not None}
    try:
        base = ServerConfig.from_file(args.config) if args.config else None
        config = ServerConfig.from_mapping(
            flags, base=ServerConfig.from_env(base=base), source="flags"
        )
        problems = config.problems() + _tls_file_problems(
            config.tls_cert, config.tls_key, config.client_ca
        )
        if problems:
            raise ConfigError(problems)
        return serve(config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"webhook serve: {problem}", file=sys.stderr)
        return 2
    except PolicyError as exc:
        return _report(f"webhook serve: invalid policy {exc.source}:", exc.problems)

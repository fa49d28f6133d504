"""Subcommands of the webhook package.

``convert`` and ``policy check`` work offline on files (``-`` reads stdin); they exit 2 with a
message naming the problem when the input is bad.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kube import documents

if TYPE_CHECKING:
    from webhook.convert import ConvertResult
    from webhook.policy import Policy


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
            "Apply the webhook's translation to a Pod or the pod template of a Deployment, "
            "StatefulSet, DaemonSet, ReplicaSet, Job or CronJob (multi-document input). Prints "
            "the converted objects, then the ResourceClaimTemplates they need. Objects without "
            "GPU requests pass through unchanged."
        ),
    )
    parser.add_argument(
        "file",
        metavar="FILE|DIR",
        help="YAML or JSON manifests; '-' reads stdin; a folder is read recursively (every "
        ".yaml, .yml and .json file, hidden folders such as .git left out)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--out-dir",
        metavar="DIR",
        help="with a folder: write each converted file to DIR at the same relative path "
        "(files with nothing to convert are not written)",
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
        help="format of what is printed or written (default yaml)",
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
        help="comma-separated legacy names a DeviceClass serves through extendedResourceName",
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
    from webhook.errors import PolicyError
    from webhook.policy import load_policy

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


MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def _manifest_files(folder: Path) -> list[Path]:
    """Every manifest under ``folder``, recursively, in a stable order; hidden folders (``.git``)
    are left out."""
    return sorted(
        f
        for f in folder.rglob("*")
        if f.is_file()
        and f.suffix.lower() in MANIFEST_SUFFIXES
        and not any(part.startswith(".") for part in f.relative_to(folder).parts)
    )


_CONVERT = "gpu-slicer convert"
"""How ``convert``'s messages begin."""


def _convert(args: argparse.Namespace) -> int:
    from webhook.errors import PolicyError
    from webhook.policy import Policy, load_policy_file

    try:
        policy = load_policy_file(args.policy) if args.policy else Policy.default()
    except PolicyError as exc:
        return _report(f"{_CONVERT}: invalid policy {exc.source}:", exc.problems)
    folder = Path(args.file) if args.file != "-" and Path(args.file).is_dir() else None
    problem = _convert_usage_problem(args, folder)
    files: list[Path] = []
    if problem is None:
        files = _manifest_files(folder) if folder is not None else [Path(args.file)]
        if folder is not None and not files:
            problem = f"{folder} holds no .yaml, .yml or .json files"
    if problem is not None:
        print(f"{_CONVERT}: {problem}", file=sys.stderr)
        return 2
    native = frozenset(n.strip() for n in args.native_extended.split(",") if n.strip())
    results = _convert_files(args, files, folder, policy, native)
    if results is None:
        return 2  # nothing written: a GitOps tree is converted whole or not at all
    _write_converted(args, folder, results)
    return 0


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
    return None


def _convert_files(
    args: argparse.Namespace,
    files: list[Path],
    folder: Path | None,
    policy: Policy,
    native: frozenset[str],
) -> list[tuple[Path, ConvertResult]] | None:
    """Every file converted, its notes printed; None when any file could not be (each one's
    problems printed), since a tree is converted whole or not at all."""
    from webhook import convert
    from webhook.errors import ManifestError

    results: list[tuple[Path, ConvertResult]] = []
    failed = False
    for path in files:
        source = "<stdin>" if args.file == "-" else str(path)
        try:
            text = documents.read_text(args.file if args.file == "-" else path)
            result = convert.convert_objects(
                convert.load_documents(text, source),
                policy=policy,
                mode=args.mode,
                namespace=args.namespace,
                native_extended=native,
            )
        except documents.DocumentError as exc:
            print(f"{_CONVERT}: {source}: {exc}", file=sys.stderr)
            failed = True
            continue
        except ManifestError as exc:
            for problem in exc.problems:
                where = "" if problem.startswith(source) else f"{source}: "
                print(f"{_CONVERT}: {where}{problem}", file=sys.stderr)
            failed = True
            continue
        label = f"{path}: " if folder is not None else ""
        for line in [*result.summaries, *result.warnings]:
            print(f"{label}{line}", file=sys.stderr)
        results.append((path, result))
    return None if failed else results


def _write_converted(
    args: argparse.Namespace, folder: Path | None, results: list[tuple[Path, ConvertResult]]
) -> None:
    """Standard output, or (a folder with --out-dir or --beside) one file per changed input."""
    from webhook import convert

    def render(items: list[Any]) -> str:
        return convert.dump_json_list(items) if args.output == "json" else convert.dump_yaml(items)

    if folder is None or not (args.out_dir or args.beside):
        sys.stdout.write(render([item for _, r in results for item in r.items]))
        return
    suffix = ".json" if args.output == "json" else ".yaml"
    for path, result in results:
        relative = path.relative_to(folder)
        if not result.summaries:
            print(f"unchanged: {relative}", file=sys.stderr)
            continue
        if args.out_dir:
            target = Path(args.out_dir) / relative.with_suffix(suffix)
        else:
            target = path.with_name(f"{path.stem}.gpu-slicer{suffix}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(result.items), encoding="utf-8")
        print(f"wrote {target}", file=sys.stderr)


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
    from webhook.config import ConfigError, ServerConfig
    from webhook.errors import PolicyError
    from webhook.server import serve

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

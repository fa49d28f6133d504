"""``gpu-slicer convert`` over files: a GitOps tree (or one stream) converted as Git keeps it.

* Every file keeps its name and format; documents conversion did not change are kept byte for
  byte, changed ones are edited in place: only the GPU lines and the claim lines differ
  (:mod:`webhook.yaml_text`); one that must be re-written whole is named in the notes.
* A ResourceClaimTemplate is written once per tree: after the documents of the first file that
  needs it. Kustomize patches are not resources, so templates their conversion needs go into
  ``gpu-slicer-templates.yaml`` beside the kustomization, which lists it under ``resources``.
* CustomResourceDefinitions in the tree decide for their kinds: one that would prune the claim
  leaves its kind's objects alone (webhook.crd_schema).
* DeviceClasses anywhere in the tree that serve a legacy name (``extendedResourceName``) leave
  pods asking for it to the scheduler, as the webhook does under ``nativeExtendedResources:
  defer``.
* ResourceQuotas anywhere in the tree limit their namespace as on a cluster: a pod that would
  escape a legacy GPU quota is left as the webhook would leave it (webhook.quota).
* One document that cannot be converted never blocks the tree: it is kept as it was and
  reported by file, kind and name; a file that is not valid YAML is kept as it was too.
* A file that holds ``{{`` is a template (Helm, Go): it is never converted in place; one that
  would change is kept as it was and named. Which files are read at all, and how they are
  written, is :mod:`webhook.tree_files`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import PurePosixPath
from typing import Any, Literal

from gpu_slicer.core.identity import NamespaceMode
from gpu_slicer.kube import documents
from gpu_slicer.webhook import json_text, yaml_text
from gpu_slicer.webhook.convert import (
    ConvertResult,
    convert_objects,
    policy_table,
    tree_crds,
    tree_extended,
    tree_quotas,
)
from gpu_slicer.webhook.policy import Policy
from gpu_slicer.webhook.remembered import Remembered

KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
CHART_FILE = "Chart.yaml"
TEMPLATES_FILE = "gpu-slicer-templates.yaml"
"""Where the templates a kustomization's patches need are written (listed in its resources)."""

TEMPLATE_MARK = "{{"
"""A file that holds it is a template (Helm, Go): never converted in place."""
_TEMPLATE_HINT = "a template? convert what it renders, e.g. through helm's --post-renderer"

Format = Literal["yaml", "json"]


@dataclass
class ManifestFile:
    """One file (or standard input) of the tree, and what conversion made of it."""

    relative: PurePosixPath
    text: str
    format: Format
    patch_of: PurePosixPath | None = None
    """The kustomization (relative path) that uses this file as a patch."""
    chunks: list[yaml_text.Chunk] = field(default_factory=list)
    result: ConvertResult | None = None
    error: str | None = None
    """Why the file was kept as it was (not valid YAML)."""
    output: str | None = None
    """The converted text; None when nothing changed."""


@dataclass
class Tree:
    """The files of a tree after conversion, and what must be added to it."""

    files: list[ManifestFile]
    added: dict[PurePosixPath, str] = field(default_factory=dict)
    """New files (templates of kustomize patches) by relative path."""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def changed(self) -> list[ManifestFile]:
        return [f for f in self.files if f.output is not None]

    def not_objects(self) -> dict[PurePosixPath, str]:
        """The files that hold no Kubernetes objects for ``kubectl apply`` (a kustomization, a
        Helm chart's ``Chart.yaml`` and values), and what each is: left out of a printed
        stream."""
        charts = {f.relative.parent for f in self.files if f.relative.name == CHART_FILE}
        found = {}
        for file in self.files:
            name = file.relative.name
            if name in KUSTOMIZATION_NAMES:
                found[file.relative] = "a kustomization (kubectl kustomize builds it)"
            elif name == CHART_FILE:
                found[file.relative] = "a Helm chart's Chart.yaml"
            elif (
                file.relative.parent in charts
                and name.startswith("values")
                and (file.relative.suffix.lower() in (".yaml", ".yml"))
            ):
                found[file.relative] = "a Helm chart's values"
        return found


def convert_tree(
    sources: Iterable[tuple[PurePosixPath, str]],
    *,
    policy: Policy,
    mode: NamespaceMode,
    namespace: str | None,
    native_extended: frozenset[str],
    read_all: bool = True,
) -> Tree:
    """Converts each ``(relative path, text)`` in order; templates are emitted once.

    ``read_all`` False (when only the text is written, not ``-o json``): a YAML document
    without GPU text (``yaml_text.may_ask_for_gpus``) is never read into the values a
    conversion keeps: it is read with libyaml for its checks alone (a list is not an object, a
    Deployment without a pod template...) and kept byte for byte (:func:`_convert_file`)."""
    files = [ManifestFile(rel, text, _format(rel)) for rel, text in sources]
    patches = _kustomize_patches(files)
    for file in files:
        file.patch_of = patches.get(file.relative)
    for file in files:
        try:
            file.chunks = yaml_text.split(file.text, read_all=read_all or file.format == "json")
        except documents.DocumentError as exc:
            file.error = str(exc)
    tree = Tree(files)
    while not _convert_files(tree, policy, mode, namespace, native_extended):
        pass  # a file found invalid had counted in the tree's CRDs, quotas or classes
    errors = [
        f"{f.relative}: {f.error}{f' ({_TEMPLATE_HINT})' if TEMPLATE_MARK in f.text else ''}; "
        "kept as it was"
        for f in files
        if f.error is not None
    ]
    tree.problems = errors + tree.problems
    return tree


def _convert_files(
    tree: Tree,
    policy: Policy,
    mode: NamespaceMode,
    namespace: str | None,
    native_extended: frozenset[str],
) -> bool:
    """Converts the files that are valid YAML as far as known; False when a document read
    only now (:func:`_convert_file`) makes a file invalid that counted in the tree's
    CustomResourceDefinitions, quotas or DeviceClasses: the tree is then converted again
    without it."""
    files = [f for f in tree.files if f.error is None]
    tree.problems, tree.notes, tree.added = [], [], {}
    values = [v for f in files for c in f.chunks for v in c.values]
    quotas = tree_quotas(values, namespace)
    crds = tree_crds(values)
    native_extended |= tree_extended(values)
    table = policy_table(policy)
    kinds = frozenset(workload.key for workload in table)
    seen: set[tuple[str, str]] = set()
    remembered = Remembered()  # the files of a tree share their workloads' shapes
    per_kustomization: dict[PurePosixPath, tuple[set[tuple[str, str]], list[str]]] = {}
    for file in files:
        file.result = file.output = None
        if file.patch_of is not None:
            emitted, texts = per_kustomization.setdefault(file.patch_of, (set(), []))
        else:
            emitted, texts = seen, []
        convert = partial(
            convert_objects,
            policy=policy,
            mode=mode,
            namespace=namespace,
            native_extended=native_extended,
            table=table,
            quiet_non_objects=file.patch_of is not None,
            quotas=quotas,
            crds=crds,
            remembered=remembered,
        )
        kept = set(emitted)  # emitted only once the whole file is read
        try:
            result = _convert_file(file, convert, kept, kinds)
        except documents.DocumentError as exc:
            file.error = str(exc)
            if any(c.values for c in file.chunks):
                return False
            continue
        file.result = result
        if TEMPLATE_MARK in file.text and (any(result.changed) or result.templates):
            # its templates count only if it is converted, which it is not
            tree.problems.append(
                f"{file.relative}: holds {TEMPLATE_MARK!r} ({_TEMPLATE_HINT}): not converted in "
                "place; kept as it was"
            )
            continue
        emitted |= kept
        tree.problems += [f"{file.relative}: {p}" for p in result.problems]
        tree.notes += [f"{file.relative}: {n}" for n in [*result.summaries, *result.warnings]]
        if file.patch_of is not None:
            texts += [yaml_text.dump(t) for t in result.templates]
            result_templates: list[dict[str, Any]] = []
        else:
            result_templates = result.templates
        file.output = _render(file, result, result_templates, tree.notes)
    for kustomization, (_, texts) in per_kustomization.items():
        if texts:
            _add_templates_file(tree, kustomization, texts)
    return True


def _convert_file(
    file: ManifestFile,
    convert: Callable[..., ConvertResult],
    seen: set[tuple[str, str]],
    kinds: frozenset[tuple[str, str]],
) -> ConvertResult:
    """The file's documents converted in order, their results joined; raises DocumentError.

    A document not read yet (no GPU text) that conversion would only check is counted and let
    go unread (``yaml_text.says_nothing``: well-formed, an object of none of ``kinds``).
    Another is read now with libyaml, converted on its own and let go: that it is valid YAML
    and a well-formed object is all it can tell. When it has anything to say (a problem, a
    note, a change), it is read again with the Python reader and converted as every other
    document, so that what is said and kept is the same."""
    result = ConvertResult()
    number = 1
    for chunk in file.chunks:
        if not chunk.read:
            if yaml_text.says_nothing(chunk.text, kinds):
                number += 1
                continue
            values = documents.parse_all_fast(chunk.text)
            part = convert(values, seen=set(), first=number, gpu_free=True)
            if not (any(part.changed) or part.templates or part.problems or part.warnings):
                number += len(values)
                continue
            try:
                values = documents.parse_all(chunk.text)
            except documents.DocumentError:
                pass  # libyaml reads what PyYAML's scanner refuses (parse_all_fast): kept
            chunk.values, chunk.read = values, True
        part = convert(chunk.values, seen=seen, first=number)
        number += len(chunk.values)
        for name in ("objects", "templates", "warnings", "summaries", "problems", "changed"):
            getattr(result, name).extend(getattr(part, name))
    return result


def _format(relative: PurePosixPath) -> Format:
    return "json" if relative.suffix.lower() == ".json" else "yaml"


def _render(
    file: ManifestFile, result: ConvertResult, templates: list[dict[str, Any]], notes: list[str]
) -> str | None:
    """The file's new text (None when conversion changed nothing in it): the changed documents
    edited in place (webhook.yaml_text), the templates after them; a document that had to be
    re-emitted whole is named in ``notes``."""
    if not any(result.changed) and not templates:
        return None
    if file.format == "json":
        if len(result.objects) == 1 and [len(c.values) for c in file.chunks] == [1]:
            edited = json_text.edit(
                file.text, file.chunks[0].values[0], result.objects[0], templates
            )
        else:
            edited = yaml_text.Edited(
                json_text.rewrite(file.text, [*result.objects, *templates]),
                "it holds more than one document",
            )
        if edited.whole is not None:
            notes.append(
                f"{file.relative}: rewritten whole, not edited in place ({edited.whole}): "
                "check its layout in the diff"
            )
        return edited.text
    parts: list[str] = []
    index = 0
    for number, chunk in enumerate(file.chunks, start=1):
        count = len(chunk.values)
        changed = result.changed[index : index + count]
        converted = result.objects[index : index + count]
        index += count
        if not any(changed):
            parts.append(chunk.text)
            continue
        edited = yaml_text.edit(chunk, converted)
        parts.append(edited.text)
        if edited.whole is not None:
            notes.append(
                f"{file.relative}: {_describe_chunk(chunk, number)} rewritten whole, not edited "
                f"in place ({edited.whole}): check its layout and comments in the diff"
            )
        notes += [
            f"{file.relative}: {_describe_chunk(chunk, number)}: {where}: check its layout "
            "and comments in the diff"
            for where in edited.reemitted
        ]
    text = "".join(parts)
    eol = yaml_text.line_ending(file.text)
    if templates and text and not text.endswith("\n"):
        text += eol
    added = "".join(yaml_text.dump(t, like=file.text) for t in templates)
    return text + yaml_text.with_line_ending(added, eol)


def _describe_chunk(chunk: yaml_text.Chunk, number: int) -> str:
    """``document 2 (Deployment infer)``."""
    value = chunk.values[0] if chunk.values else None
    if isinstance(value, dict) and isinstance(value.get("metadata"), dict):
        name = value["metadata"].get("name") or value["metadata"].get("generateName")
        return f"document {number} ({value.get('kind')} {name})"
    return f"document {number}"


def _list(items: list[Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


# --- kustomize ----------------------------------------------------------------------------------


def _kustomize_patches(files: list[ManifestFile]) -> dict[PurePosixPath, PurePosixPath]:
    """Patch file -> the kustomization that applies it (patches[].path, patchesStrategicMerge)."""
    out: dict[PurePosixPath, PurePosixPath] = {}
    for file in files:
        if file.relative.name not in KUSTOMIZATION_NAMES:
            continue
        try:
            data = documents.parse(file.text)
        except documents.DocumentError:
            continue
        if not isinstance(data, dict):
            continue
        listed: list[Any] = list(data.get("patchesStrategicMerge") or [])
        listed += [p.get("path") for p in data.get("patches") or [] if isinstance(p, dict)]
        for entry in listed:
            if isinstance(entry, str) and entry and "\n" not in entry:
                out[_normal(file.relative.parent / entry)] = file.relative
    return out


def _normal(path: PurePosixPath) -> PurePosixPath:
    """``a/b/../c`` -> ``a/c`` (kustomize paths may climb)."""
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _add_templates_file(tree: Tree, kustomization: PurePosixPath, texts: list[str]) -> None:
    """Writes the templates beside ``kustomization`` and lists the file in its resources."""
    target = kustomization.parent / TEMPLATES_FILE
    tree.added[target] = "".join(texts)
    file = next(f for f in tree.files if f.relative == kustomization)
    every = yaml_text.split(file.output or file.text)
    chunks = [c for c in every if c.values]
    if len(chunks) != 1 or len(chunks[0].values) != 1 or not isinstance(chunks[0].values[0], dict):
        tree.problems.append(f"{kustomization}: cannot add {TEMPLATES_FILE} to its resources")
        return
    chunk = chunks[0]
    data = dict(chunk.values[0])
    resources = list(data.get("resources") or [])
    if TEMPLATES_FILE not in resources:
        data["resources"] = [*resources, TEMPLATES_FILE]
        edited = yaml_text.edit(chunk, [data])
        if edited.whole is not None:
            tree.notes.append(
                f"{kustomization}: rewritten whole, not edited in place ({edited.whole})"
            )
        tree.notes += [f"{kustomization}: {where}" for where in edited.reemitted]
        file.output = "".join(edited.text if c is chunk else c.text for c in every)
    tree.notes.append(
        f"{target}: the templates of {kustomization}'s patches (listed in its resources)"
    )

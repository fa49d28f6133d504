"""Simulated-GPU specs: ``H100-80GB:2,A100-80GB:1`` -> the catalog models of GPUs 0, 1 and 2.

A spec is how a person (``--simulate-gpus``) or a test describes a node without hardware. Each
comma-separated part is ``<model>[:<count>]``; the model is a catalog key or alias, in any case,
and the count defaults to 1. GPU indices follow the order of the parts.
"""

from __future__ import annotations

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.errors import CatalogError, GpuSpecError

MAX_GPUS = 64
"""More GPUs than any server holds (8-16 today); a bigger spec is a typo, not a node."""


def parse_gpu_spec(spec: str) -> list[gpu_model.GpuModel]:
    """The models of a simulated node, one entry per GPU, in GPU-index order."""
    if not spec or not spec.strip():
        raise GpuSpecError(_problem("an empty spec", "name at least one GPU model"))
    models: list[gpu_model.GpuModel] = []
    for raw_part in spec.split(","):
        part = raw_part.strip()
        if not part:
            raise GpuSpecError(_problem(f"an empty part in {spec!r}", "remove the extra comma"))
        key, sep, count_text = part.partition(":")
        key = key.strip()
        count = 1
        if sep:
            count_text = count_text.strip()
            if not count_text.isdigit() or int(count_text) < 1:
                raise GpuSpecError(
                    _problem(f"{part!r}: the count {count_text!r}", "use a whole number >= 1")
                )
            count = int(count_text)
            if count > MAX_GPUS:
                raise GpuSpecError(
                    _problem(f"{part!r}: the count {count}", f"a node has at most {MAX_GPUS} GPUs")
                )
        if not key:
            raise GpuSpecError(_problem(f"{part!r}: no model before ':'", "name a model"))
        try:
            model = catalog.get_model(key)
        except CatalogError:
            raise GpuSpecError(_problem(f"{part!r}: unknown model {key!r}", "")) from None
        models.extend([model] * count)
        if len(models) > MAX_GPUS:
            raise GpuSpecError(
                _problem(f"{len(models)} GPUs in {spec!r}", f"a node has at most {MAX_GPUS} GPUs")
            )
    return models


def _problem(what: str, hint: str) -> str:
    hint_text = f"; {hint}" if hint else ""
    return (
        f"bad GPU spec: {what}{hint_text}. Expected <model>[:<count>][,...], "
        f"e.g. H100-80GB:2,A100-80GB:1; known models: {', '.join(catalog.model_keys())}"
    )

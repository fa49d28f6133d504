"""Fixtures of the webhook tests; builders live in webhook_cases.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpu_slicer.webhook.policy import Policy, load_policy
from gpu_slicer.webhook.translate import Conversion, translate_pod
from tests.support.webhook_cases import Pod


@pytest.fixture
def policy() -> Policy:
    return Policy.default()


@pytest.fixture
def embeddings_policy() -> Policy:
    return load_policy(
        """
        namespaces:
          embeddings:
            gpu: [1g.10gb, 2g.20gb, 3g.40gb]
        """
    )


@pytest.fixture
def translate(policy: Policy) -> Callable[..., Conversion]:
    """translate_pod with the default policy and namespace ``ml`` unless told otherwise."""

    def run(pod: Pod, **kwargs: Any) -> Conversion:
        kwargs.setdefault("namespace", "ml")
        kwargs.setdefault("policy", policy)
        return translate_pod(pod, **kwargs)

    return run

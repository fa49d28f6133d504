"""Kubernetes' rules for object names, checked before a name reaches the apiserver.

Most objects (nodes, Secrets, webhook configurations) are named by a DNS subdomain: lower-case
letters, digits, '-' and '.', starting and ending alphanumeric, at most 253 characters.
Namespaces and a few others take a DNS label: no dots, at most 63 characters.
"""

from __future__ import annotations

import re

DNS_SUBDOMAIN_MAX = 253
DNS_LABEL_MAX = 63
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_DNS_LABEL = re.compile(_LABEL)


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= DNS_SUBDOMAIN_MAX and _DNS_SUBDOMAIN.fullmatch(name) is not None


def is_dns_label(name: str) -> bool:
    return len(name) <= DNS_LABEL_MAX and _DNS_LABEL.fullmatch(name) is not None


def subdomain_problem(flag: str, name: str, kind: str, *, suffix: str = "") -> str | None:
    """Why ``name`` (given as ``flag``) cannot name a ``kind`` object, or None when it can.

    ``suffix``: a name derived from this one by appending it must fit too.
    """
    if not _DNS_SUBDOMAIN.fullmatch(name) or len(name + suffix) > DNS_SUBDOMAIN_MAX:
        return (
            f"{flag} {name!r} is not a valid {kind} name: lower-case letters, digits, '-' "
            f"and '.', at most {DNS_SUBDOMAIN_MAX - len(suffix)} characters"
        )
    return None

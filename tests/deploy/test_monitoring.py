"""The alerts and the dashboard watch metrics the code exports, in PromQL that parses.

A renamed metric or label would leave an alert silent forever and a panel empty; nothing else
would notice. The expressions are parsed with promql-parser (a port of Prometheus' own parser),
the metric and label names checked against the registries of the webhook and the agent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from test_helm import CHART, MONITORING, template

from gpu_slicer.slicer.agent_metrics import AgentMetrics, PublisherMetrics
from gpu_slicer.webhook.metrics import Metrics

# Series Prometheus itself makes for every target.
BUILTIN = {"up": set[str]()}
# Labels that come from the scrape, not from the code: the target's (job, instance, namespace,
# pod, container, endpoint, service), "node" from the PodMonitor's relabeling, and "le" of
# histogram buckets.
TARGET_LABELS = {
    "job",
    "instance",
    "namespace",
    "pod",
    "container",
    "endpoint",
    "service",
    "node",
    "le",
}
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("_sum", "_count", ""),
}


def exported() -> dict[str, set[str]]:
    """Every series name the webhook and agent can expose -> its labels."""
    agent = AgentMetrics()
    PublisherMetrics(agent.registry)
    webhook = Metrics(certificate=Path("/nonexistent/tls.crt"))
    series: dict[str, set[str]] = dict(BUILTIN)
    for registry in (agent.registry, webhook.registry):
        for family in registry.collect():
            labels = set(_declared_labels(registry, family.name))
            for suffix in SUFFIXES[family.type]:
                series[family.name + suffix] = labels
    return series


def _declared_labels(registry: Any, name: str) -> tuple[str, ...]:
    collectors = registry._names_to_collectors  # the only place label names are kept
    for key in (name, name + "_total"):
        collector = collectors.get(key)
        if collector is not None:
            return tuple(getattr(collector, "_labelnames", ()))
    return ()


def _walk(node: Any) -> Iterator[Any]:
    yield node
    for attribute in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield from _walk(child)
    for child in getattr(node, "args", None) or []:
        yield from _walk(child)


def used(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """(metric -> label names matched on it, label names grouped by) of a PromQL expression."""
    tree = promql_parser.parse(expr)
    metrics: dict[str, set[str]] = {}
    grouping: set[str] = set()
    for node in _walk(tree):
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            metrics.setdefault(node.name, set()).update(m.name for m in node.matchers.matchers)
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            grouping.update(node.modifier.labels)
    return metrics, grouping


def _check(where: str, expr: str, series: dict[str, set[str]]) -> list[str]:
    try:
        metrics, grouping = used(expr)
    except ValueError as exc:
        return [f"{where}: does not parse: {exc}"]
    problems = []
    for metric, labels in metrics.items():
        if metric not in series:
            problems.append(f"{where}: {metric} is not a metric the code exports")
            continue
        unknown = labels - series[metric] - TARGET_LABELS
        if unknown:
            problems.append(f"{where}: {metric} has no label {sorted(unknown)}")
    known = set().union(*(series[m] for m in metrics if m in series)) | TARGET_LABELS
    if grouping - known:
        problems.append(f"{where}: groups by unknown labels {sorted(grouping - known)}")
    return problems


def _rules() -> list[dict[str, Any]]:
    objects = template(["certificates.mode=self-managed", *MONITORING])
    [rule] = [o for o in objects if o["kind"] == "PrometheusRule"]
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    return loaded


def _grafana_to_promql(expr: str) -> str:
    """Grafana's variables replaced by what they stand for at query time."""
    return expr.replace("$__rate_interval", "5m").replace("$node", ".*")


def test_the_checker_catches_unknown_metrics_labels_and_syntax_errors() -> None:
    series = exported()
    assert _check("t", "sum(rate(gpu_slicer_webhook_requests_total[5m]))", series) == []
    assert _check("t", "rate(gpu_slicer_webhook_request_total[5m])", series)  # typo
    assert _check("t", 'gpu_slicer_agent_instances{colour="red"}', series)
    assert _check("t", "sum by (gpu_model) (gpu_slicer_agent_instances)", series)
    assert _check("t", "sum(rate(gpu_slicer_webhook_requests_total[5m])", series)


def test_the_code_exports_the_metrics_the_alerts_are_about() -> None:
    series = exported()
    for name in (
        "gpu_slicer_webhook_certificate_expiry_timestamp_seconds",
        "gpu_slicer_agent_mig_created_total",
        "gpu_slicer_agent_mig_destroyed_total",
        "gpu_slicer_agent_prepare_seconds_bucket",
        "gpu_slicer_webhook_request_duration_seconds_bucket",
    ):
        assert name in series
    assert series["gpu_slicer_agent_instances"] == {"profile", "owner"}


def test_every_alert_expression_parses_and_names_exported_metrics_and_labels() -> None:
    series = exported()
    rules = _rules()
    assert len(rules) >= 10
    problems = [p for r in rules for p in _check(r["alert"], r["expr"], series)]
    assert not problems, "\n".join(problems)


def test_the_alerts_cover_what_an_admin_is_paged_for() -> None:
    watched = {m for r in _rules() for m in used(r["expr"])[0]}
    for metric in (
        "gpu_slicer_webhook_requests_total",  # errors, admissions left unconverted
        "gpu_slicer_webhook_request_duration_seconds_bucket",  # latency
        "gpu_slicer_agent_prepares_total",  # prepare failures
        "gpu_slicer_agent_instances",  # foreign instances
        "gpu_slicer_agent_orphans_destroyed_total",  # leaked instances
        "gpu_slicer_slices_publishes_total",  # slice publication
        "gpu_slicer_webhook_certificate_expiry_timestamp_seconds",  # certificate expiry
    ):
        assert metric in watched, f"no alert watches {metric}"


def test_every_dashboard_query_parses_and_names_exported_metrics_and_labels() -> None:
    series = exported()
    dashboard = _dashboard()
    problems = []
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels
    for panel in panels:
        assert panel["targets"], f"panel {panel['title']} has no query"
        for target in panel["targets"]:
            problems += _check(panel["title"], _grafana_to_promql(target["expr"]), series)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"]["query"])
        assert match, variable
        problems += _check(f"variable {variable['name']}", match.group(1), series)
        assert match.group(2) in series[match.group(1)] | TARGET_LABELS
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "needed",
    [
        "gpu_slicer_webhook_requests_total",
        "gpu_slicer_agent_free_memory_slices",
        "gpu_slicer_agent_prepare_seconds_bucket",
        "gpu_slicer_agent_mig_created_total",
        "gpu_slicer_agent_mig_destroyed_total",
    ],
)
def test_the_dashboard_shows_admissions_slices_prepare_latency_and_mig_churn(
    needed: str,
) -> None:
    queries = [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]
    assert any(needed in used(_grafana_to_promql(q))[0] for q in queries)


def test_panels_do_not_overlap_and_have_unique_ids() -> None:
    panels = _dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"panel {panel['title']} overlaps another"
        cells |= mine


def test_the_rule_file_is_a_list_of_groups_even_before_templating() -> None:
    text = (CHART / "files" / "prometheus-rules.yaml").read_text()
    # `tpl` replaces {{ .Values... }}; the `{{ $value }}` of the annotations are escaped for it.
    untemplated = re.sub(r"\{\{ \.Values\.[\w.]+ \}\}", "14", text)
    groups = yaml.safe_load(untemplated)["groups"]
    assert [g["name"] for g in groups] == ["gpu-slicer-webhook", "gpu-slicer-agent"]

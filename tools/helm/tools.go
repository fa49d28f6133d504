//go:build tools

// Package tools pins the helm command the chart tests build from this module
// (tests/deploy/helm_tool.py); nothing here is shipped.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)

//go:build tools

// Package tools pins the kustomize command the KRM function test builds from this module
// (sandbox/kustomize.py): kubectl's embedded kustomize runs no exec functions. Nothing here
// is shipped.
package tools

import (
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)

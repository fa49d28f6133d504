//go:build tools

// Package tools pins the JobSet controller the end-to-end tier runs in the sandbox
// (sandbox/operators.py builds it into the cache); nothing here is shipped.
package tools

import (
	_ "sigs.k8s.io/jobset"
)

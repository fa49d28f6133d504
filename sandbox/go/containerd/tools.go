//go:build tools

// Package tools pins the container runtime of the sandbox's real node: containerd, its runc
// shim and ctr (sandbox/containerd.py builds them into the cache); nothing here is shipped.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)

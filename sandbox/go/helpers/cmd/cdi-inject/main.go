// Command cdi-inject does what a CDI-enabled container runtime does with the device ids the
// kubelet hands it: it loads the CDI spec files from the spec folders with the reference CDI
// library (tags.cncf.io/container-device-interface), refuses any spec the library refuses,
// resolves the ids and injects their edits into an OCI runtime spec, which it prints as JSON.
//
// A GPU-less machine has no /dev/nvidia* nodes, and the library needs a device node's type and
// major number, which it reads from the host node when the spec leaves them out. With
// --stand-in-missing-device-nodes such nodes are given type "c" before injection and listed in
// the output; everything else (parsing, validation, resolution, edit merging) is the library's.
//
// Usage: cdi-inject [--stand-in-missing-device-nodes] --spec-dir DIR [--spec-dir DIR...] ID...
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

type dirs []string

func (d *dirs) String() string     { return strings.Join(*d, ",") }
func (d *dirs) Set(v string) error { *d = append(*d, v); return nil }

type result struct {
	Spec               *oci.Spec `json:"spec,omitempty"`
	Error              string    `json:"error,omitempty"`
	SpecErrors         []string  `json:"specErrors,omitempty"`
	Unresolved         []string  `json:"unresolved,omitempty"`
	StandInDeviceNodes []string  `json:"standInDeviceNodes,omitempty"`
}

func main() {
	var specDirs dirs
	flag.Var(&specDirs, "spec-dir", "CDI spec folder (repeatable)")
	standIn := flag.Bool("stand-in-missing-device-nodes", false,
		"give device nodes absent on this host type c instead of failing")
	flag.Parse()
	out := run(specDirs, flag.Args(), *standIn)
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
	if out.Error != "" {
		os.Exit(1)
	}
}

func run(specDirs []string, ids []string, standIn bool) result {
	if len(specDirs) == 0 || len(ids) == 0 {
		return result{Error: "usage: cdi-inject --spec-dir DIR... ID..."}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDirs...), cdi.WithAutoRefresh(false))
	var out result
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			out.SpecErrors = append(out.SpecErrors, fmt.Sprintf("%s: %v", path, e))
		}
	}
	sort.Strings(out.SpecErrors)
	if err != nil || len(out.SpecErrors) > 0 {
		out.Error = "the CDI library refused spec files"
		if err != nil {
			out.Error += ": " + err.Error()
		}
		return out
	}
	if standIn {
		for _, id := range ids {
			if dev := cache.GetDevice(id); dev != nil {
				out.StandInDeviceNodes = append(out.StandInDeviceNodes,
					standInNodes(dev.ContainerEdits.DeviceNodes)...)
				out.StandInDeviceNodes = append(out.StandInDeviceNodes,
					standInNodes(dev.GetSpec().ContainerEdits.DeviceNodes)...)
			}
		}
	}
	spec := &oci.Spec{Version: oci.Version, Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := cache.InjectDevices(spec, ids...)
	if err != nil {
		out.Unresolved = unresolved
		out.Error = err.Error()
		return out
	}
	out.Spec = spec
	return out
}

// standInNodes marks device nodes that do not exist on this host as character devices.
func standInNodes(nodes []*specs.DeviceNode) []string {
	var changed []string
	for _, node := range nodes {
		host := node.HostPath
		if host == "" {
			host = node.Path
		}
		if _, err := os.Stat(host); err == nil || node.Type != "" {
			continue
		}
		node.Type = "c"
		if node.Major == 0 {
			node.Major = 1
		}
		changed = append(changed, node.Path)
	}
	return changed
}

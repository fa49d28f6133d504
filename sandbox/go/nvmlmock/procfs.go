package main

import (
	"fmt"
	"os"
	"path/filepath"
)

// The driver publishes the capability device minors of each GPU and compute instance under
// /proc/driver/nvidia/capabilities; the agent reads them to give a container its
// /dev/nvidia-caps nodes. With a root set (gpuSlicerMockSetRoot), the mock keeps those files
// under <root>/proc/... as instances come and go, with the driver's numbering (the mig-minors
// table): 3 + 135*gpu + 9*gi for a GPU instance, that + 1 + ci for a compute instance.

var procRoot string

func capsDir(g *gpu) string {
	return filepath.Join(procRoot, "proc/driver/nvidia/capabilities", fmt.Sprintf("gpu%d", g.dev.Minor), "mig")
}

func giMinor(g *gpu, gi uint32) int { return 3 + 135*g.dev.Minor + 9*int(gi) }

func writeAccess(dir string, minor int) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		lastError = err.Error()
		return
	}
	text := fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor)
	if err := os.WriteFile(filepath.Join(dir, "access"), []byte(text), 0o644); err != nil {
		lastError = err.Error()
	}
}

func publishGi(gi *gpuInstance) {
	if procRoot == "" {
		return
	}
	id := gi.gi.Info.Id
	writeAccess(filepath.Join(capsDir(gi.gpu), fmt.Sprintf("gi%d", id)), giMinor(gi.gpu, id))
}

func publishCi(ci *computeInstance) {
	if procRoot == "" {
		return
	}
	g, giID, ciID := ci.gi.gpu, ci.gi.gi.Info.Id, ci.ci.Info.Id
	dir := filepath.Join(capsDir(g), fmt.Sprintf("gi%d", giID), fmt.Sprintf("ci%d", ciID))
	writeAccess(dir, giMinor(g, giID)+1+int(ciID))
}

func withdrawGi(g *gpu, gi uint32) {
	if procRoot != "" {
		_ = os.RemoveAll(filepath.Join(capsDir(g), fmt.Sprintf("gi%d", gi)))
	}
}

func withdrawCi(g *gpu, gi, ci uint32) {
	if procRoot != "" {
		_ = os.RemoveAll(filepath.Join(capsDir(g), fmt.Sprintf("gi%d", gi), fmt.Sprintf("ci%d", ci)))
	}
}

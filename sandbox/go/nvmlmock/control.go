package main

// Test controls: functions outside NVML's API, prefixed gpuSlicerMock, that tests call through
// ctypes to set the node up and to make the GPU misbehave. Each returns 0 on success, else an
// NVML return code (INVALID_ARGUMENT for a bad index).

/*
#include <stdint.h>
*/
import "C"

import (
	"encoding/json"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

var lastError string

// gpuSlicerMockReset replaces the node by the GPUs of spec ("h100:2,l4") and forgets every
// instance, handle, event set and fault. Handles taken before are invalid afterwards.
//
//export gpuSlicerMockReset
func gpuSlicerMockReset(spec *C.char) C.int {
	mu.Lock()
	defer mu.Unlock()
	if err := state.reset(C.GoString(spec)); err != nil {
		lastError = err.Error()
		return C.int(nvml.ERROR_INVALID_ARGUMENT)
	}
	return 0
}

// gpuSlicerMockSetRoot makes the mock keep the driver's capability files under root (see
// procfs.go); an empty root stops it.
//
//export gpuSlicerMockSetRoot
func gpuSlicerMockSetRoot(root *C.char) C.int {
	mu.Lock()
	defer mu.Unlock()
	procRoot = C.GoString(root)
	return 0
}

// gpuSlicerMockLastError is the message of the last failed control call.
//
//export gpuSlicerMockLastError
func gpuSlicerMockLastError(buf *C.char, length C.uint) C.int {
	mu.Lock()
	defer mu.Unlock()
	return C.int(putString(buf, length, lastError))
}

// gpuSlicerMockFail makes the next `times` calls of an NVML function return code. The function
// is named as the library exports it (nvmlDeviceGetCount_v2; nvmlInitWithFlags also covers
// nvmlInit_v2, which calls it).
//
//export gpuSlicerMockFail
func gpuSlicerMockFail(function *C.char, code C.int, times C.int) C.int {
	mu.Lock()
	defer mu.Unlock()
	state.faults[C.GoString(function)] = &fault{ret: nvml.Return(code), times: int(times)}
	return 0
}

// onGpuAt runs fn on GPU index under the lock; INVALID_ARGUMENT for an index out of range.
func onGpuAt(index C.uint, fn func(*gpu)) C.int {
	mu.Lock()
	defer mu.Unlock()
	if int(index) >= len(state.gpus) {
		lastError = "no such GPU index"
		return C.int(nvml.ERROR_INVALID_ARGUMENT)
	}
	fn(state.gpus[index])
	return 0
}

// gpuSlicerMockSetMigMode sets the current and pending MIG mode as a node would boot with them.
//
//export gpuSlicerMockSetMigMode
func gpuSlicerMockSetMigMode(index C.uint, current, pending C.int) C.int {
	return onGpuAt(index, func(g *gpu) {
		g.current, g.pending = int(current), int(pending)
		g.dev.MigMode = int(current)
	})
}

// gpuSlicerMockNeedsReset marks a GPU whose MIG mode changes stay pending until a reset the
// driver cannot do itself (a cloud VM with the GPU passed through).
//
//export gpuSlicerMockNeedsReset
func gpuSlicerMockNeedsReset(index C.uint, needs C.int) C.int {
	return onGpuAt(index, func(g *gpu) {
		g.needsReset = needs != 0
	})
}

// gpuSlicerMockProfilesNeedMig makes the GPU report its GPU-instance profiles only while MIG
// is on (NOT_SUPPORTED before), as some drivers do.
//
//export gpuSlicerMockProfilesNeedMig
func gpuSlicerMockProfilesNeedMig(index C.uint, needs C.int) C.int {
	return onGpuAt(index, func(g *gpu) {
		g.profilesNeedMig = needs != 0
	})
}

// gpuSlicerMockResetGpu is the GPU reset: the pending MIG mode takes effect, instances are gone.
//
//export gpuSlicerMockResetGpu
func gpuSlicerMockResetGpu(index C.uint) C.int {
	return onGpuAt(index, func(g *gpu) {
		for id, gi := range g.gis {
			for _, ci := range gi.cis {
				delete(state.cis, ci.handle)
				delete(state.migs, ci.migHandle)
			}
			delete(state.gis, gi.handle)
			_ = gi.gi.Destroy()
			delete(g.gis, id)
			withdrawGi(g, id)
		}
		g.processes = map[uint32][]uint32{}
		g.current = g.pending
		g.dev.MigMode = g.current
	})
}

// gpuSlicerMockMoveCiProfile offers, on one GPU, the compute-instance profile of constant from
// under constant to instead (for every GPU-instance profile that has it): a GPU whose full-size
// compute instance is not the one a table assumes.
//
//export gpuSlicerMockMoveCiProfile
func gpuSlicerMockMoveCiProfile(index C.uint, from, to C.int) C.int {
	return onGpuAt(index, func(g *gpu) {
		for _, cis := range g.ciProfiles {
			if info, ok := cis[int(from)]; ok {
				delete(cis, int(from))
				info.Id = uint32(to)
				cis[int(to)] = info
			}
		}
	})
}

// gpuSlicerMockSetProcess puts a process (pid) on a GPU instance; pid 0 removes them all.
//
//export gpuSlicerMockSetProcess
func gpuSlicerMockSetProcess(index C.uint, giID C.uint, pid C.uint) C.int {
	return onGpuAt(index, func(g *gpu) {
		if pid == 0 {
			delete(g.processes, uint32(giID))
		} else {
			g.processes[uint32(giID)] = append(g.processes[uint32(giID)], uint32(pid))
		}
	})
}

// gpuSlicerMockXid delivers an Xid critical error of the GPU to the event sets registered for it.
//
//export gpuSlicerMockXid
func gpuSlicerMockXid(index C.uint, xid C.ulonglong) C.int {
	return onGpuAt(index, func(g *gpu) {
		for _, s := range g.xidEventSet {
			s.queue <- event{device: g.handle, eventType: uint64(nvml.EventTypeXidCriticalError), data: uint64(xid)}
		}
	})
}

// gpuSlicerMockSetFabric puts a GPU in a fabric clique: 16 bytes of cluster UUID, the clique id
// and the probe state (3: complete).
//
//export gpuSlicerMockSetFabric
func gpuSlicerMockSetFabric(index C.uint, cluster *C.uchar, clique C.uint, probe C.uint) C.int {
	return onGpuAt(index, func(g *gpu) {
		f := &fabric{clique: uint32(clique), state: uint8(probe)}
		copy(f.cluster[:], unsafe.Slice((*byte)(unsafe.Pointer(cluster)), 16))
		g.fabric = f
	})
}

// gpuSlicerMockLoseGpu makes every call on the GPU answer GPU_IS_LOST (lost != 0) or not.
//
//export gpuSlicerMockLoseGpu
func gpuSlicerMockLoseGpu(index C.uint, lost C.int) C.int {
	return onGpuAt(index, func(g *gpu) {
		g.lost = lost != 0
	})
}

type describedCI struct {
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profile_id"`
	UUID      string `json:"uuid"`
}

type describedGI struct {
	ID        uint32        `json:"id"`
	ProfileID uint32        `json:"profile_id"`
	Start     uint32        `json:"start"`
	Size      uint32        `json:"size"`
	Compute   []describedCI `json:"compute_instances"`
}

type describedGPU struct {
	Index      int           `json:"index"`
	UUID       string        `json:"uuid"`
	Name       string        `json:"name"`
	MigCurrent int           `json:"mig_current"`
	MigPending int           `json:"mig_pending"`
	Instances  []describedGI `json:"gpu_instances"`
	MigCapable bool          `json:"mig_capable"`
	NeedsReset bool          `json:"needs_reset"`
}

// gpuSlicerMockDescribe writes the node as JSON: the mock's own view, not NVML's answers.
//
//export gpuSlicerMockDescribe
func gpuSlicerMockDescribe(buf *C.char, length C.uint) C.int {
	mu.Lock()
	defer mu.Unlock()
	out := struct {
		Initialized int            `json:"initialized"`
		GPUs        []describedGPU `json:"gpus"`
	}{Initialized: state.initCount}
	for _, g := range state.gpus {
		d := describedGPU{
			Index: g.index, UUID: g.dev.UUID, Name: g.dev.Config.Name, MigCurrent: g.current,
			MigPending: g.pending, MigCapable: g.migCapable, NeedsReset: g.needsReset,
			Instances: []describedGI{},
		}
		for _, gi := range g.sortedInstances() {
			dg := describedGI{
				ID: gi.gi.Info.Id, ProfileID: gi.gi.Info.ProfileId,
				Start: gi.gi.Info.Placement.Start, Size: gi.gi.Info.Placement.Size,
				Compute: []describedCI{},
			}
			for _, ci := range gi.sortedCompute() {
				dg.Compute = append(dg.Compute, describedCI{ci.ci.Info.Id, ci.ci.Info.ProfileId, ci.uuid})
			}
			d.Instances = append(d.Instances, dg)
		}
		out.GPUs = append(out.GPUs, d)
	}
	text, _ := json.Marshal(out)
	if len(text)+1 > int(length) {
		return C.int(-(len(text) + 1))
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(length))
	copy(dst, text)
	dst[len(text)] = 0
	return 0
}

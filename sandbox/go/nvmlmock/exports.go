package main

/*
#cgo CFLAGS: -DNVML_NO_UNVERSIONED_FUNC_DEFS
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "nvml.h"

static nvmlDevice_t mkDevice(uintptr_t v) { nvmlDevice_t d; d.handle = (struct nvmlDevice_st*)v; return d; }
static uintptr_t ofDevice(nvmlDevice_t d) { return (uintptr_t)d.handle; }
static nvmlGpuInstance_t mkGi(uintptr_t v) { nvmlGpuInstance_t g; g.handle = (struct nvmlGpuInstance_st*)v; return g; }
static uintptr_t ofGi(nvmlGpuInstance_t g) { return (uintptr_t)g.handle; }
static nvmlComputeInstance_t mkCi(uintptr_t v) { nvmlComputeInstance_t c; c.handle = (struct nvmlComputeInstance_st*)v; return c; }
static uintptr_t ofCi(nvmlComputeInstance_t c) { return (uintptr_t)c.handle; }
static nvmlEventSet_t mkSet(uintptr_t v) { nvmlEventSet_t s; s.handle = (struct nvmlEventSet_st*)v; return s; }
static uintptr_t ofSet(nvmlEventSet_t s) { return (uintptr_t)s.handle; }
static void setGi(nvmlGpuInstance_t *array, unsigned int i, uintptr_t v) { array[i] = mkGi(v); }
static void setCi(nvmlComputeInstance_t *array, unsigned int i, uintptr_t v) { array[i] = mkCi(v); }
*/
import "C"

import (
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

func ret(r nvml.Return) C.nvmlReturn_t { return C.nvmlReturn_t(r) }

// putString copies s into a C buffer of length n, as NVML does (INSUFFICIENT_SIZE if it does not fit).
func putString(dst *C.char, n C.uint, s string) nvml.Return {
	if dst == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if len(s)+1 > int(n) {
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(dst)), int(n))
	copy(buf, s)
	buf[len(s)] = 0
	return nvml.SUCCESS
}

func putFixed(dst []C.char, s string) {
	for i := range dst {
		dst[i] = 0
	}
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = C.char(s[i])
	}
}

// enter locks the mock and applies an injected fault of the function, if any.
func enter(function string) (nvml.Return, bool) {
	mu.Lock()
	return state.take(function)
}

// on runs fn under the lock for an exported NVML function: an injected fault of the function
// answers first, then NVML's answer for a handle that is bad, uninitialised or lost.
func on[T any](function string, find func() (T, nvml.Return), fn func(T) nvml.Return) C.nvmlReturn_t {
	r, faulted := enter(function)
	defer mu.Unlock()
	if faulted {
		return ret(r)
	}
	found, r := find()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	return ret(fn(found))
}

func onDevice(function string, device C.nvmlDevice_t, fn func(*gpu) nvml.Return) C.nvmlReturn_t {
	return on(function, func() (*gpu, nvml.Return) { return state.device(uintptr(C.ofDevice(device))) }, fn)
}

func onGpuInstance(function string, gi C.nvmlGpuInstance_t, fn func(*gpuInstance) nvml.Return) C.nvmlReturn_t {
	return on(function, func() (*gpuInstance, nvml.Return) { return state.gpuInstance(uintptr(C.ofGi(gi))) }, fn)
}

func onComputeInstance(function string, ci C.nvmlComputeInstance_t, fn func(*computeInstance) nvml.Return) C.nvmlReturn_t {
	return on(function, func() (*computeInstance, nvml.Return) { return state.computeInstance(uintptr(C.ofCi(ci))) }, fn)
}

// migOrGpu is a device handle resolved: the GPU, and the compute instance of a MIG device handle.
type migOrGpu struct {
	gpu *gpu
	ci  *computeInstance
}

func onAnyDevice(function string, device C.nvmlDevice_t, fn func(*gpu, *computeInstance) nvml.Return) C.nvmlReturn_t {
	find := func() (migOrGpu, nvml.Return) {
		g, ci, r := anyDevice(device)
		return migOrGpu{g, ci}, r
	}
	return on(function, find, func(d migOrGpu) nvml.Return { return fn(d.gpu, d.ci) })
}

// --- init ---------------------------------------------------------------------------------

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.nvmlReturn_t {
	always := func() (struct{}, nvml.Return) { return struct{}{}, nvml.SUCCESS }
	return on("nvmlInitWithFlags", always, func(struct{}) nvml.Return {
		if state.gpus == nil {
			if err := state.reset("h100:8"); err != nil {
				return nvml.ERROR_UNKNOWN
			}
		}
		state.initCount++
		return nvml.SUCCESS
	})
}

//export nvmlInit_v2
func nvmlInit_v2() C.nvmlReturn_t { return nvmlInitWithFlags(0) }

//export nvmlShutdown
func nvmlShutdown() C.nvmlReturn_t {
	return onSystem("nvmlShutdown", func() nvml.Return {
		state.initCount--
		return nvml.SUCCESS
	})
}

var errorStrings = map[nvml.Return]*C.char{}

// gpuSlicerErrorText backs nvmlErrorString (const_wrappers.c): one C string per code, kept.
//
//export gpuSlicerErrorText
func gpuSlicerErrorText(result C.nvmlReturn_t) *C.char {
	mu.Lock()
	defer mu.Unlock()
	r := nvml.Return(result)
	s, ok := errorStrings[r]
	if !ok {
		s = C.CString(errorText(r))
		errorStrings[r] = s
	}
	return s
}

func errorText(r nvml.Return) string {
	texts := map[nvml.Return]string{
		nvml.SUCCESS:                      "Success",
		nvml.ERROR_UNINITIALIZED:          "Uninitialized",
		nvml.ERROR_INVALID_ARGUMENT:       "Invalid Argument",
		nvml.ERROR_NOT_SUPPORTED:          "Not Supported",
		nvml.ERROR_NO_PERMISSION:          "Insufficient Permissions",
		nvml.ERROR_NOT_FOUND:              "Not Found",
		nvml.ERROR_INSUFFICIENT_SIZE:      "Insufficient Size",
		nvml.ERROR_TIMEOUT:                "Timeout",
		nvml.ERROR_GPU_IS_LOST:            "GPU is lost",
		nvml.ERROR_RESET_REQUIRED:         "GPU requires reset",
		nvml.ERROR_IN_USE:                 "In use by another client",
		nvml.ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
		nvml.ERROR_UNKNOWN:                "Unknown Error",
	}
	if t, ok := texts[r]; ok {
		return t
	}
	return "Unknown Error"
}

// --- system -------------------------------------------------------------------------------

// onSystem is on for a function of the whole system: it needs NVML initialised.
func onSystem(function string, fn func() nvml.Return) C.nvmlReturn_t {
	initialised := func() (struct{}, nvml.Return) {
		if state.initCount == 0 {
			return struct{}{}, nvml.ERROR_UNINITIALIZED
		}
		return struct{}{}, nvml.SUCCESS
	}
	return on(function, initialised, func(struct{}) nvml.Return { return fn() })
}

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	return onSystem("nvmlSystemGetDriverVersion", func() nvml.Return {
		return putString(version, length, "580.95.05")
	})
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	return onSystem("nvmlSystemGetNVMLVersion", func() nvml.Return {
		return putString(version, length, "13.580.95.05")
	})
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(v *C.int) C.nvmlReturn_t {
	return onSystem("nvmlSystemGetCudaDriverVersion", func() nvml.Return {
		*v = 13000
		return nvml.SUCCESS
	})
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(v *C.int) C.nvmlReturn_t {
	return nvmlSystemGetCudaDriverVersion(v)
}

// --- devices ------------------------------------------------------------------------------

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(count *C.uint) C.nvmlReturn_t {
	return onSystem("nvmlDeviceGetCount_v2", func() nvml.Return {
		*count = C.uint(len(state.gpus))
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(index C.uint, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return onSystem("nvmlDeviceGetHandleByIndex_v2", func() nvml.Return {
		if int(index) >= len(state.gpus) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*device = C.mkDevice(C.uintptr_t(state.gpus[index].handle))
		return nvml.SUCCESS
	})
}

// anyDevice resolves a GPU or a MIG device handle.
func anyDevice(h C.nvmlDevice_t) (*gpu, *computeInstance, nvml.Return) {
	v := uintptr(C.ofDevice(h))
	if ci, ok := state.migs[v]; ok {
		if state.initCount == 0 {
			return nil, nil, nvml.ERROR_UNINITIALIZED
		}
		return ci.gi.gpu, ci, nvml.SUCCESS
	}
	g, r := state.device(v)
	return g, nil, r
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(device C.nvmlDevice_t, name *C.char, length C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetName", device, func(g *gpu) nvml.Return {
		return putString(name, length, g.dev.Config.Name)
	})
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(device C.nvmlDevice_t, uuid *C.char, length C.uint) C.nvmlReturn_t {
	return onAnyDevice("nvmlDeviceGetUUID", device, func(g *gpu, ci *computeInstance) nvml.Return {
		if ci != nil {
			return putString(uuid, length, ci.uuid)
		}
		return putString(uuid, length, g.dev.UUID)
	})
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(device C.nvmlDevice_t, brand *C.nvmlBrandType_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetBrand", device, func(g *gpu) nvml.Return {
		*brand = C.nvmlBrandType_t(g.dev.Config.Brand)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(device C.nvmlDevice_t, arch *C.nvmlDeviceArchitecture_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetArchitecture", device, func(g *gpu) nvml.Return {
		*arch = C.nvmlDeviceArchitecture_t(g.dev.Config.Architecture)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(device C.nvmlDevice_t, minor *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMinorNumber", device, func(g *gpu) nvml.Return {
		*minor = C.uint(g.dev.Minor)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(device C.nvmlDevice_t, index *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetIndex", device, func(g *gpu) nvml.Return {
		*index = C.uint(g.index)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(device C.nvmlDevice_t, major, minor *C.int) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetCudaComputeCapability", device, func(g *gpu) nvml.Return {
		*major, *minor = C.int(g.dev.Config.CudaMajor), C.int(g.dev.Config.CudaMinor)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(device C.nvmlDevice_t, memory *C.nvmlMemory_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMemoryInfo", device, func(g *gpu) nvml.Return {
		memory.total = C.ulonglong(g.dev.MemoryInfo.Total)
		memory.free = C.ulonglong(g.dev.MemoryInfo.Total)
		memory.used = 0
		return nvml.SUCCESS
	})
}

// busID is NVML's spelling of the mock's PCI address: 00000000:XX:00.0.
func busID(g *gpu) string {
	return "0000" + strings.ToUpper(g.dev.PciBusID)
}

func fillPci(pci *C.nvmlPciInfo_t, g *gpu) {
	id := busID(g)
	putFixed(pci.busId[:], id)
	putFixed(pci.busIdLegacy[:], id[4:])
	pci.domain = 0
	pci.bus = C.uint(g.index)
	pci.device = 0
	pci.pciDeviceId = C.uint(g.dev.Config.PciDeviceId)
	pci.pciSubSystemId = 0
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(device C.nvmlDevice_t, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetPciInfo_v3", device, func(g *gpu) nvml.Return {
		fillPci(pci, g)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetComputeRunningProcesses_v3
func nvmlDeviceGetComputeRunningProcesses_v3(device C.nvmlDevice_t, count *C.uint, infos *C.nvmlProcessInfo_t) C.nvmlReturn_t {
	return onAnyDevice("nvmlDeviceGetComputeRunningProcesses_v3", device, func(g *gpu, ci *computeInstance) nvml.Return {
		var pids []uint32
		for giID, list := range g.processes {
			if ci == nil || ci.gi.gi.Info.Id == giID {
				pids = append(pids, list...)
			}
		}
		if len(pids) == 0 {
			*count = 0
			return nvml.SUCCESS
		}
		if infos == nil || int(*count) < len(pids) {
			*count = C.uint(len(pids))
			return nvml.ERROR_INSUFFICIENT_SIZE
		}
		out := unsafe.Slice(infos, int(*count))
		for i, pid := range pids {
			out[i] = C.nvmlProcessInfo_t{}
			out[i].pid = C.uint(pid)
			out[i].usedGpuMemory = C.ulonglong(1 << 30)
		}
		*count = C.uint(len(pids))
		return nvml.SUCCESS
	})
}

// --- NVLink: an HGX board, every link active and leading to an NVSwitch; none on PCIe cards. ----

//export nvmlDeviceGetNvLinkState
func nvmlDeviceGetNvLinkState(device C.nvmlDevice_t, link C.uint, active *C.nvmlEnableState_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetNvLinkState", device, func(g *gpu) nvml.Return {
		if !g.migCapable || link >= 18 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		*active = C.NVML_FEATURE_ENABLED
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetNvLinkRemoteDeviceType
func nvmlDeviceGetNvLinkRemoteDeviceType(device C.nvmlDevice_t, link C.uint, kind *C.nvmlIntNvLinkDeviceType_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetNvLinkRemoteDeviceType", device, func(g *gpu) nvml.Return {
		if !g.migCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		*kind = C.NVML_NVLINK_DEVICE_TYPE_SWITCH
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetNvLinkRemotePciInfo_v2
func nvmlDeviceGetNvLinkRemotePciInfo_v2(device C.nvmlDevice_t, link C.uint, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetNvLinkRemotePciInfo_v2", device, func(g *gpu) nvml.Return {
		if !g.migCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		*pci = C.nvmlPciInfo_t{}
		putFixed(pci.busId[:], "00000000:C0:00.0")
		return nvml.SUCCESS
	})
}

// nvmlDeviceGetGpuFabricInfoV answers for a GPU given a fabric clique (gpuSlicerMockSetFabric),
// in the v2 or v3 layout the caller's version field asks for; other GPUs have no fabric.
//
//export nvmlDeviceGetGpuFabricInfoV
func nvmlDeviceGetGpuFabricInfoV(device C.nvmlDevice_t, info *C.nvmlGpuFabricInfoV_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetGpuFabricInfoV", device, func(g *gpu) nvml.Return {
		if g.fabric == nil {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if info.version != C.nvmlGpuFabricInfo_v2 && info.version != C.nvmlGpuFabricInfo_v3 {
			return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
		}
		for i, b := range g.fabric.cluster {
			info.clusterUuid[i] = C.uchar(b)
		}
		info.status = ret(nvml.SUCCESS)
		info.cliqueId = C.uint(g.fabric.clique)
		info.state = C.nvmlGpuFabricState_t(g.fabric.state)
		info.healthMask = 0
		if info.version == C.nvmlGpuFabricInfo_v3 {
			info.healthSummary = 0
		}
		return nvml.SUCCESS
	})
}

// --- MIG mode -----------------------------------------------------------------------------

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(device C.nvmlDevice_t, current, pending *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMigMode", device, func(g *gpu) nvml.Return {
		if !g.migCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		*current, *pending = C.uint(g.current), C.uint(g.pending)
		return nvml.SUCCESS
	})
}

// nvmlDeviceSetMigMode: the call succeeds and the activation status says whether the mode took
// effect: IN_USE while instances exist, RESET_REQUIRED (mode left pending) on a GPU marked as
// needing a reset, as NVML does where it cannot reset the GPU itself (pass-through VMs).
//
//export nvmlDeviceSetMigMode
func nvmlDeviceSetMigMode(device C.nvmlDevice_t, mode C.uint, activation *C.nvmlReturn_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceSetMigMode", device, func(g *gpu) nvml.Return {
		if !g.migCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if mode > 1 {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		switch {
		case len(g.gis) > 0:
			*activation = ret(nvml.ERROR_IN_USE)
		case g.needsReset && int(mode) != g.current:
			g.pending = int(mode)
			*activation = ret(nvml.ERROR_RESET_REQUIRED)
		default:
			g.current, g.pending = int(mode), int(mode)
			g.dev.MigMode = int(mode)
			*activation = ret(nvml.SUCCESS)
		}
		return nvml.SUCCESS
	})
}

// fillHandles answers an NVML list call: INSUFFICIENT_SIZE and the count needed when the
// caller's array is too small, else the handles and their count.
func fillHandles(count *C.uint, handles []uintptr, set func(int, uintptr)) nvml.Return {
	if int(*count) < len(handles) {
		*count = C.uint(len(handles))
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	for i, h := range handles {
		set(i, h)
	}
	*count = C.uint(len(handles))
	return nvml.SUCCESS
}

// --- GPU instances ------------------------------------------------------------------------

func giProfile(g *gpu, profile C.uint) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	if !g.migCapable || (g.profilesNeedMig && g.current != 1) {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	info, r := g.dev.GetGpuInstanceProfileInfo(int(profile))
	return info, r
}

func fillGiProfileV(out *C.nvmlGpuInstanceProfileInfo_v2_t, g *gpu, profile int, in nvml.GpuInstanceProfileInfo) {
	out.id = C.uint(in.Id)
	out.isP2pSupported = C.uint(in.IsP2pSupported)
	out.sliceCount = C.uint(in.SliceCount)
	out.instanceCount = C.uint(in.InstanceCount)
	out.multiprocessorCount = C.uint(in.MultiprocessorCount)
	out.copyEngineCount = C.uint(in.CopyEngineCount)
	out.decoderCount = C.uint(in.DecoderCount)
	out.encoderCount = C.uint(in.EncoderCount)
	out.jpegCount = C.uint(in.JpegCount)
	out.ofaCount = C.uint(in.OfaCount)
	out.memorySizeMB = C.ulonglong(in.MemorySizeMB)
	putFixed(out.name[:], profileName(g, profile, in))
}

//export nvmlDeviceGetGpuInstanceProfileInfoV
func nvmlDeviceGetGpuInstanceProfileInfoV(device C.nvmlDevice_t, profile C.uint, info *C.nvmlGpuInstanceProfileInfo_v2_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetGpuInstanceProfileInfoV", device, func(g *gpu) nvml.Return {
		if info.version != C.nvmlGpuInstanceProfileInfo_v2 && info.version != C.nvmlGpuInstanceProfileInfo_v3 {
			return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
		}
		in, r := giProfile(g, profile)
		if r != nvml.SUCCESS {
			return r
		}
		fillGiProfileV(info, g, int(profile), in)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetGpuInstancePossiblePlacements_v2
func nvmlDeviceGetGpuInstancePossiblePlacements_v2(device C.nvmlDevice_t, profileID C.uint, placements *C.nvmlGpuInstancePlacement_t, count *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetGpuInstancePossiblePlacements_v2", device, func(g *gpu) nvml.Return {
		if !g.migCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if count == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		found, ok := g.dev.Config.MIGProfiles.GpuInstancePlacements[int(profileID)]
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if placements == nil {
			*count = C.uint(len(found))
			return nvml.SUCCESS
		}
		if int(*count) < len(found) {
			*count = C.uint(len(found))
			return nvml.ERROR_INSUFFICIENT_SIZE
		}
		out := unsafe.Slice(placements, len(found))
		for i, p := range found {
			out[i].start, out[i].size = C.uint(p.Start), C.uint(p.Size)
		}
		*count = C.uint(len(found))
		return nvml.SUCCESS
	})
}

// gpuSlicerCreateGpuInstance backs nvmlDeviceCreateGpuInstanceWithPlacement (const_wrappers.c).
//
//export gpuSlicerCreateGpuInstance
func gpuSlicerCreateGpuInstance(device C.nvmlDevice_t, profileID C.uint, placement *C.nvmlGpuInstancePlacement_t, out *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceCreateGpuInstanceWithPlacement", device, func(g *gpu) nvml.Return {
		if !g.migCapable || g.current != 1 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if placement == nil || out == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		p := nvml.GpuInstancePlacement{Start: uint32(placement.start), Size: uint32(placement.size)}
		if r := g.placementFree(int(profileID), p); r != nvml.SUCCESS {
			return r
		}
		info := g.dev.Config.MIGProfiles.GpuInstanceProfiles[int(profileID)]
		created, r := g.dev.CreateGpuInstanceWithPlacement(&info, &p)
		if r != nvml.SUCCESS {
			return r
		}
		gi := &gpuInstance{
			gpu:    g,
			gi:     created.(*server.GpuInstance),
			handle: state.newHandle(giBase),
			cis:    map[uint32]*computeInstance{},
		}
		g.gis[gi.gi.Info.Id] = gi
		state.gis[gi.handle] = gi
		publishGi(gi)
		*out = C.mkGi(C.uintptr_t(gi.handle))
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetGpuInstances
func nvmlDeviceGetGpuInstances(device C.nvmlDevice_t, profileID C.uint, instances *C.nvmlGpuInstance_t, count *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetGpuInstances", device, func(g *gpu) nvml.Return {
		if !g.migCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if _, ok := g.dev.Config.MIGProfiles.GpuInstanceProfiles[int(profileID)]; !ok || count == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		var found []uintptr
		for _, gi := range g.sortedInstances() {
			if gi.gi.Info.ProfileId == uint32(profileID) {
				found = append(found, gi.handle)
			}
		}
		return fillHandles(count, found, func(i int, h uintptr) {
			C.setGi(instances, C.uint(i), C.uintptr_t(h))
		})
	})
}

//export nvmlDeviceGetGpuInstanceById
func nvmlDeviceGetGpuInstanceById(device C.nvmlDevice_t, id C.uint, out *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetGpuInstanceById", device, func(g *gpu) nvml.Return {
		if !g.migCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		gi, ok := g.gis[uint32(id)]
		if !ok {
			return nvml.ERROR_NOT_FOUND
		}
		*out = C.mkGi(C.uintptr_t(gi.handle))
		return nvml.SUCCESS
	})
}

//export nvmlGpuInstanceGetInfo
func nvmlGpuInstanceGetInfo(handle C.nvmlGpuInstance_t, info *C.nvmlGpuInstanceInfo_t) C.nvmlReturn_t {
	return onGpuInstance("nvmlGpuInstanceGetInfo", handle, func(gi *gpuInstance) nvml.Return {
		in := gi.gi.Info
		info.device = C.mkDevice(C.uintptr_t(gi.gpu.handle))
		info.id = C.uint(in.Id)
		info.profileId = C.uint(in.ProfileId)
		info.placement.start = C.uint(in.Placement.Start)
		info.placement.size = C.uint(in.Placement.Size)
		return nvml.SUCCESS
	})
}

//export nvmlGpuInstanceDestroy
func nvmlGpuInstanceDestroy(handle C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return onGpuInstance("nvmlGpuInstanceDestroy", handle, func(gi *gpuInstance) nvml.Return {
		if len(gi.cis) > 0 || len(gi.gpu.processes[gi.gi.Info.Id]) > 0 {
			return nvml.ERROR_IN_USE
		}
		if r := gi.gi.Destroy(); r != nvml.SUCCESS {
			return r
		}
		delete(gi.gpu.gis, gi.gi.Info.Id)
		delete(state.gis, gi.handle)
		withdrawGi(gi.gpu, gi.gi.Info.Id)
		return nvml.SUCCESS
	})
}

// --- compute instances --------------------------------------------------------------------

//export nvmlGpuInstanceGetComputeInstanceProfileInfoV
func nvmlGpuInstanceGetComputeInstanceProfileInfoV(handle C.nvmlGpuInstance_t, profile, engProfile C.uint, info *C.nvmlComputeInstanceProfileInfo_v2_t) C.nvmlReturn_t {
	return onGpuInstance("nvmlGpuInstanceGetComputeInstanceProfileInfoV", handle, func(gi *gpuInstance) nvml.Return {
		if info.version != C.nvmlComputeInstanceProfileInfo_v2 {
			return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
		}
		if int(profile) >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if int(engProfile) != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ERROR_NOT_SUPPORTED
		}
		in, ok := gi.gpu.ciProfiles[int(gi.gi.Info.ProfileId)][int(profile)]
		if !ok {
			return nvml.ERROR_NOT_SUPPORTED
		}
		info.id = C.uint(in.Id)
		info.sliceCount = C.uint(in.SliceCount)
		info.instanceCount = C.uint(in.InstanceCount)
		info.multiprocessorCount = C.uint(in.MultiprocessorCount)
		info.sharedCopyEngineCount = C.uint(in.SharedCopyEngineCount)
		info.sharedDecoderCount = C.uint(in.SharedDecoderCount)
		info.sharedEncoderCount = C.uint(in.SharedEncoderCount)
		info.sharedJpegCount = C.uint(in.SharedJpegCount)
		info.sharedOfaCount = C.uint(in.SharedOfaCount)
		putFixed(info.name[:], "")
		return nvml.SUCCESS
	})
}

// ciProfileByID finds the compute-instance profile whose id (not constant) is profileID.
func ciProfileByID(gi *gpuInstance, profileID C.uint) (nvml.ComputeInstanceProfileInfo, bool) {
	for _, info := range gi.gpu.ciProfiles[int(gi.gi.Info.ProfileId)] {
		if info.Id == uint32(profileID) {
			return info, true
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, false
}

//export nvmlGpuInstanceCreateComputeInstance
func nvmlGpuInstanceCreateComputeInstance(handle C.nvmlGpuInstance_t, profileID C.uint, out *C.nvmlComputeInstance_t) C.nvmlReturn_t {
	return onGpuInstance("nvmlGpuInstanceCreateComputeInstance", handle, func(gi *gpuInstance) nvml.Return {
		info, ok := ciProfileByID(gi, profileID)
		if !ok || out == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		used := uint32(0)
		for _, ci := range gi.cis {
			p, _ := ciProfileByID(gi, C.uint(ci.ci.Info.ProfileId))
			used += p.SliceCount
		}
		giInfo := gi.gpu.dev.Config.MIGProfiles.GpuInstanceProfiles[int(gi.gi.Info.ProfileId)]
		if used+info.SliceCount > giInfo.SliceCount {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		created, r := gi.gi.CreateComputeInstance(&info)
		if r != nvml.SUCCESS {
			return r
		}
		state.migSerial++
		ci := &computeInstance{
			gi:        gi,
			ci:        created.(*server.ComputeInstance),
			handle:    state.newHandle(ciBase),
			migHandle: state.newHandle(migBase),
			uuid:      migUUID(gi.gpu, state.migSerial),
		}
		gi.cis[ci.ci.Info.Id] = ci
		state.cis[ci.handle] = ci
		state.migs[ci.migHandle] = ci
		publishCi(ci)
		*out = C.mkCi(C.uintptr_t(ci.handle))
		return nvml.SUCCESS
	})
}

// migUUID is unique per creation, as real MIG UUIDs are: the GPU's UUID with a serial at the end.
func migUUID(g *gpu, serial int) string {
	base := strings.TrimPrefix(g.dev.UUID, "GPU-")
	return fmt.Sprintf("MIG-%s%012d", base[:24], serial)
}

//export nvmlGpuInstanceGetComputeInstances
func nvmlGpuInstanceGetComputeInstances(handle C.nvmlGpuInstance_t, profileID C.uint, instances *C.nvmlComputeInstance_t, count *C.uint) C.nvmlReturn_t {
	return onGpuInstance("nvmlGpuInstanceGetComputeInstances", handle, func(gi *gpuInstance) nvml.Return {
		if _, ok := ciProfileByID(gi, profileID); !ok || count == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		var found []uintptr
		for _, ci := range gi.sortedCompute() {
			if ci.ci.Info.ProfileId == uint32(profileID) {
				found = append(found, ci.handle)
			}
		}
		return fillHandles(count, found, func(i int, h uintptr) {
			C.setCi(instances, C.uint(i), C.uintptr_t(h))
		})
	})
}

//export nvmlGpuInstanceGetComputeInstanceById
func nvmlGpuInstanceGetComputeInstanceById(handle C.nvmlGpuInstance_t, id C.uint, out *C.nvmlComputeInstance_t) C.nvmlReturn_t {
	return onGpuInstance("nvmlGpuInstanceGetComputeInstanceById", handle, func(gi *gpuInstance) nvml.Return {
		ci, ok := gi.cis[uint32(id)]
		if !ok {
			return nvml.ERROR_NOT_FOUND
		}
		*out = C.mkCi(C.uintptr_t(ci.handle))
		return nvml.SUCCESS
	})
}

//export nvmlComputeInstanceGetInfo_v2
func nvmlComputeInstanceGetInfo_v2(handle C.nvmlComputeInstance_t, info *C.nvmlComputeInstanceInfo_t) C.nvmlReturn_t {
	return onComputeInstance("nvmlComputeInstanceGetInfo_v2", handle, func(ci *computeInstance) nvml.Return {
		info.device = C.mkDevice(C.uintptr_t(ci.migHandle))
		info.gpuInstance = C.mkGi(C.uintptr_t(ci.gi.handle))
		info.id = C.uint(ci.ci.Info.Id)
		info.profileId = C.uint(ci.ci.Info.ProfileId)
		p, _ := ciProfileByID(ci.gi, C.uint(ci.ci.Info.ProfileId))
		info.placement.start = 0
		info.placement.size = C.uint(p.SliceCount)
		return nvml.SUCCESS
	})
}

//export nvmlComputeInstanceDestroy
func nvmlComputeInstanceDestroy(handle C.nvmlComputeInstance_t) C.nvmlReturn_t {
	return onComputeInstance("nvmlComputeInstanceDestroy", handle, func(ci *computeInstance) nvml.Return {
		if len(ci.gi.gpu.processes[ci.gi.gi.Info.Id]) > 0 {
			return nvml.ERROR_IN_USE
		}
		if r := ci.ci.Destroy(); r != nvml.SUCCESS {
			return r
		}
		delete(ci.gi.cis, ci.ci.Info.Id)
		delete(state.cis, ci.handle)
		delete(state.migs, ci.migHandle)
		withdrawCi(ci.gi.gpu, ci.gi.gi.Info.Id, ci.ci.Info.Id)
		return nvml.SUCCESS
	})
}

// --- MIG device handles -------------------------------------------------------------------

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(device C.nvmlDevice_t, isMig *C.uint) C.nvmlReturn_t {
	return onAnyDevice("nvmlDeviceIsMigDeviceHandle", device, func(_ *gpu, ci *computeInstance) nvml.Return {
		*isMig = 0
		if ci != nil {
			*isMig = 1
		}
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetGpuInstanceId
func nvmlDeviceGetGpuInstanceId(device C.nvmlDevice_t, id *C.uint) C.nvmlReturn_t {
	return onAnyDevice("nvmlDeviceGetGpuInstanceId", device, func(_ *gpu, ci *computeInstance) nvml.Return {
		if ci == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*id = C.uint(ci.gi.gi.Info.Id)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetComputeInstanceId
func nvmlDeviceGetComputeInstanceId(device C.nvmlDevice_t, id *C.uint) C.nvmlReturn_t {
	return onAnyDevice("nvmlDeviceGetComputeInstanceId", device, func(_ *gpu, ci *computeInstance) nvml.Return {
		if ci == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*id = C.uint(ci.ci.Info.Id)
		return nvml.SUCCESS
	})
}

// --- events -------------------------------------------------------------------------------

//export nvmlEventSetCreate
func nvmlEventSetCreate(set *C.nvmlEventSet_t) C.nvmlReturn_t {
	return onSystem("nvmlEventSetCreate", func() nvml.Return {
		s := &eventSet{handle: state.newHandle(eventSetBase), queue: make(chan event, 1024)}
		state.eventSets[s.handle] = s
		*set = C.mkSet(C.uintptr_t(s.handle))
		return nvml.SUCCESS
	})
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(device C.nvmlDevice_t, types C.ulonglong, set C.nvmlEventSet_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceRegisterEvents", device, func(g *gpu) nvml.Return {
		s, ok := state.eventSets[uintptr(C.ofSet(set))]
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if uint64(types)&uint64(nvml.EventTypeXidCriticalError) != 0 {
			g.xidEventSet = append(g.xidEventSet, s)
		}
		return nvml.SUCCESS
	})
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set C.nvmlEventSet_t, data *C.nvmlEventData_t, timeoutMs C.uint) C.nvmlReturn_t {
	r, faulted := enter("nvmlEventSetWait_v2")
	s, ok := state.eventSets[uintptr(C.ofSet(set))]
	mu.Unlock() // not held while waiting: the events come from another thread
	if faulted {
		return ret(r)
	}
	if !ok {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	var e event
	select {
	case e = <-s.queue:
	case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
		return ret(nvml.ERROR_TIMEOUT)
	}
	*data = C.nvmlEventData_t{}
	data.device = C.mkDevice(C.uintptr_t(e.device))
	data.eventType = C.ulonglong(e.eventType)
	data.eventData = C.ulonglong(e.data)
	data.gpuInstanceId = C.uint(0xFFFFFFFF)
	data.computeInstanceId = C.uint(0xFFFFFFFF)
	return ret(nvml.SUCCESS)
}

//export nvmlEventSetFree
func nvmlEventSetFree(set C.nvmlEventSet_t) C.nvmlReturn_t {
	return onSystem("nvmlEventSetFree", func() nvml.Return {
		h := uintptr(C.ofSet(set))
		if _, ok := state.eventSets[h]; !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		delete(state.eventSets, h)
		for _, g := range state.gpus {
			kept := g.xidEventSet[:0]
			for _, s := range g.xidEventSet {
				if s.handle != h {
					kept = append(kept, s)
				}
			}
			g.xidEventSet = kept
		}
		return nvml.SUCCESS
	})
}

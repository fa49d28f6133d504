// Package main builds libnvidia-ml.so.1 for tests: the NVML C functions gpu-slicer's agent calls
// through nvidia-ml-py, backed by the mock servers of github.com/NVIDIA/go-nvml
// (pkg/nvml/mock/server, with the gpus package's DGX A100/H100/H200/B200 tables).
//
// The mock keeps profiles, placements and instance bookkeeping; this file adds what it lacks
// and real NVML does (each addition is listed in docs/agent.md, "The mock NVML library"):
// placement checks (legal start, overlap, instance count), MIG device handles with MIG UUIDs for
// compute instances, look-ups by GI/CI id, IN_USE for a GPU instance that still has compute
// instances or a MIG mode change while instances exist, MIG mode that stays pending until a
// reset when a GPU is marked so, profile names in the v2 profile structs, GPUs without MIG,
// XID events, PCI bus ids, and fault injection for tests. Handles are small integers cast to
// pointers, never Go pointers.
package main

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Handle ranges: the kind of a handle is its value's range.
const (
	deviceBase   = 0x10000
	migBase      = 0x20000
	giBase       = 0x30000
	ciBase       = 0x40000
	eventSetBase = 0x50000
)

// nonMig returns a GPU without MIG (an L4 or L40S beside MIG GPUs): NVML answers NOT_SUPPORTED
// to every MIG call on it. PCI device ids 0x27B8 (L4) and 0x26B9 (L40S).
func nonMig(name string, memoryMB uint64, pciID uint32) gpus.Config {
	return gpus.Config{
		Name:         name,
		Architecture: nvml.DEVICE_ARCH_ADA,
		Brand:        nvml.BRAND_NVIDIA,
		MemoryMB:     memoryMB,
		CudaMajor:    8,
		CudaMinor:    9,
		PciDeviceId:  pciID,
	}
}

// memorySlicePlacements gives an 8-slice GPU the placements real NVML reports: in memory
// slices (3g: size 4 at 0 and 4; 7g: size 8; the double-memory 1g: size 2 at 0, 2, 4, 6). The
// mock's H100, H200 and B200 tables give sizes in compute slices (3, 7, 1); its A100 table has
// the layout NVIDIA's MIG user guide documents for every 8-slice GPU, so it is reused.
func memorySlicePlacements(config gpus.Config) gpus.Config {
	profiles := config.MIGProfiles
	profiles.GpuInstancePlacements = gpus.A100_SXM4_40GB.MIGProfiles.GpuInstancePlacements
	config.MIGProfiles = profiles
	return config
}

// models are the names a spec may use.
var models = map[string]gpus.Config{
	"a100-sxm4-40gb": gpus.A100_SXM4_40GB,
	"a100-sxm4-80gb": gpus.A100_SXM4_80GB,
	"a100-pcie-40gb": gpus.A100_PCIE_40GB,
	"a100-pcie-80gb": gpus.A100_PCIE_80GB,
	"a30":            gpus.A30_PCIE_24GB,
	"h100":           memorySlicePlacements(gpus.H100_SXM5_80GB),
	"h200":           memorySlicePlacements(gpus.H200_SXM5_141GB),
	"b200":           memorySlicePlacements(gpus.B200_SXM5_180GB),
	"l4":             nonMig("NVIDIA L4", 23034, 0x27B810DE),
	"l40s":           nonMig("NVIDIA L40S", 46068, 0x26B910DE),
}

type gpu struct {
	index      int
	dev        *server.Device
	migCapable bool
	current    int
	pending    int
	needsReset bool
	// profilesNeedMig: GPU-instance profiles are reported only with MIG on, as some drivers do.
	profilesNeedMig bool
	lost            bool
	ciProfiles      map[int]map[int]nvml.ComputeInstanceProfileInfo
	gis             map[uint32]*gpuInstance
	handle          uintptr
	processes       map[uint32][]uint32 // GI id -> pids
	xidEventSet     []*eventSet
	fabric          *fabric
}

// fabric is a GPU's place in a multi-node NVLink fabric (GB200 NVL and the like).
type fabric struct {
	cluster [16]byte
	clique  uint32
	state   uint8
}

type gpuInstance struct {
	gpu    *gpu
	gi     *server.GpuInstance
	handle uintptr
	cis    map[uint32]*computeInstance
}

type computeInstance struct {
	gi        *gpuInstance
	ci        *server.ComputeInstance
	handle    uintptr
	migHandle uintptr
	uuid      string
}

type event struct {
	device    uintptr
	eventType uint64
	data      uint64
}

type eventSet struct {
	handle uintptr
	queue  chan event
}

type fault struct {
	ret   nvml.Return
	times int
}

// mu guards state: every exported function takes it.
var mu sync.Mutex

// world is the whole mock node.
type world struct {
	initCount int
	gpus      []*gpu
	gis       map[uintptr]*gpuInstance
	cis       map[uintptr]*computeInstance
	migs      map[uintptr]*computeInstance
	eventSets map[uintptr]*eventSet
	next      uintptr
	faults    map[string]*fault
	migSerial int
}

var state = newWorld()

func newWorld() *world {
	return &world{
		gis:       map[uintptr]*gpuInstance{},
		cis:       map[uintptr]*computeInstance{},
		migs:      map[uintptr]*computeInstance{},
		eventSets: map[uintptr]*eventSet{},
		faults:    map[string]*fault{},
	}
}

// reset replaces the node with the GPUs of spec: "h100:2,l4" (model[:count], comma-separated).
func (w *world) reset(spec string) error {
	var configs []gpus.Config
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(strings.ToLower(part))
		if part == "" {
			continue
		}
		name, countText, _ := strings.Cut(part, ":")
		config, ok := models[name]
		if !ok {
			known := make([]string, 0, len(models))
			for k := range models {
				known = append(known, k)
			}
			sort.Strings(known)
			return fmt.Errorf("unknown model %q; known: %s", name, strings.Join(known, ", "))
		}
		count := 1
		if countText != "" {
			if _, err := fmt.Sscanf(countText, "%d", &count); err != nil || count < 1 {
				return fmt.Errorf("bad count in %q", part)
			}
		}
		for range count {
			configs = append(configs, config)
		}
	}
	if len(configs) == 0 {
		return fmt.Errorf("the spec %q names no GPU", spec)
	}
	srv := server.NewServerWithGPUs("580.95.05", "13.580.95.05", 13000, configs...)
	fresh := newWorld()
	fresh.initCount = w.initCount
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		g := &gpu{
			index:      i,
			dev:        dev,
			migCapable: len(dev.Config.MIGProfiles.GpuInstanceProfiles) > 0,
			ciProfiles: copyCiProfiles(dev.Config.MIGProfiles.ComputeInstanceProfiles),
			gis:        map[uint32]*gpuInstance{},
			handle:     deviceBase + uintptr(i),
			processes:  map[uint32][]uint32{},
		}
		// Ampere keeps MIG mode across reboots and is usually run with it on; Hopper and newer
		// start with it off, as the mock does.
		if dev.Config.Architecture == nvml.DEVICE_ARCH_AMPERE && g.migCapable {
			g.current, g.pending = 1, 1
		}
		fresh.gpus = append(fresh.gpus, g)
	}
	*w = *fresh
	return nil
}

func copyCiProfiles(in map[int]map[int]nvml.ComputeInstanceProfileInfo) map[int]map[int]nvml.ComputeInstanceProfileInfo {
	out := map[int]map[int]nvml.ComputeInstanceProfileInfo{}
	for gi, cis := range in {
		out[gi] = map[int]nvml.ComputeInstanceProfileInfo{}
		for ci, info := range cis {
			out[gi][ci] = info
		}
	}
	return out
}

func (w *world) newHandle(base uintptr) uintptr {
	w.next++
	return base + w.next
}

// take consumes an injected fault of the named function, if any.
func (w *world) take(function string) (nvml.Return, bool) {
	f, ok := w.faults[function]
	if !ok {
		return nvml.SUCCESS, false
	}
	f.times--
	if f.times <= 0 {
		delete(w.faults, function)
	}
	return f.ret, true
}

func (w *world) device(h uintptr) (*gpu, nvml.Return) {
	if w.initCount == 0 {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	i := int(h) - deviceBase
	if h < deviceBase || i >= len(w.gpus) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	g := w.gpus[i]
	if g.lost {
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	return g, nvml.SUCCESS
}

// lookup finds a handle's object: UNINITIALIZED before nvmlInit, INVALID_ARGUMENT for a handle
// it does not know (a destroyed instance's), GPU_IS_LOST when the object's GPU is lost.
func lookup[T any](w *world, items map[uintptr]T, h uintptr, gpuOf func(T) *gpu) (T, nvml.Return) {
	var none T
	if w.initCount == 0 {
		return none, nvml.ERROR_UNINITIALIZED
	}
	item, ok := items[h]
	if !ok {
		return none, nvml.ERROR_INVALID_ARGUMENT
	}
	if gpuOf(item).lost {
		return none, nvml.ERROR_GPU_IS_LOST
	}
	return item, nvml.SUCCESS
}

func (w *world) gpuInstance(h uintptr) (*gpuInstance, nvml.Return) {
	return lookup(w, w.gis, h, func(gi *gpuInstance) *gpu { return gi.gpu })
}

func (w *world) computeInstance(h uintptr) (*computeInstance, nvml.Return) {
	return lookup(w, w.cis, h, func(ci *computeInstance) *gpu { return ci.gi.gpu })
}

// profileName is what real NVML puts in the v2 struct: "MIG 1g.10gb", with "+me" for the
// profile that owns the media engines. NVIDIA names a profile by its share of the GPU's memory
// slices times the GPU's memory in GB, rounded half up (H200: 3g.71gb is 4/8 of 141); that rule
// gives every name the mock's tables carry in their comments.
func profileName(g *gpu, profile int, info nvml.GpuInstanceProfileInfo) string {
	placements := g.dev.Config.MIGProfiles.GpuInstancePlacements
	slices, size := uint32(0), uint32(0)
	for id, list := range placements {
		for _, p := range list {
			slices = max(slices, p.Start+p.Size)
			if id == profile {
				size = p.Size
			}
		}
	}
	gb := int(math.Floor(float64(g.dev.Config.MemoryMB)/1024*float64(size)/float64(slices) + 0.5))
	name := fmt.Sprintf("MIG %dg.%dgb", info.SliceCount, gb)
	switch profile {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		name += "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		name += "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		name += "-me"
	}
	return name
}

// placementFree says why a GPU instance cannot go at placement, or SUCCESS: the start must be
// one the profile lists, its memory slices must be free, and the profile's count not reached.
func (g *gpu) placementFree(profile int, p nvml.GpuInstancePlacement) nvml.Return {
	info, ok := g.dev.Config.MIGProfiles.GpuInstanceProfiles[profile]
	if !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	legal := false
	for _, q := range g.dev.Config.MIGProfiles.GpuInstancePlacements[profile] {
		if q == p {
			legal = true
		}
	}
	if !legal {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	same := uint32(0)
	for _, other := range g.gis {
		o := other.gi.Info.Placement
		if p.Start < o.Start+o.Size && o.Start < p.Start+p.Size {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		if int(other.gi.Info.ProfileId) == profile {
			same++
		}
	}
	if same >= info.InstanceCount {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

func (g *gpu) sortedInstances() []*gpuInstance { return byID(g.gis) }

func (gi *gpuInstance) sortedCompute() []*computeInstance { return byID(gi.cis) }

// byID lists the values of a map keyed by instance id, lowest id first.
func byID[V any](m map[uint32]*V) []*V {
	out := make([]*V, 0, len(m))
	for _, id := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[id])
	}
	return out
}

func main() {}

// The two NVML functions whose C signatures use const, which a cgo export cannot spell: each
// forwards to its Go implementation in exports.go.
#ifndef NVML_NO_UNVERSIONED_FUNC_DEFS
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#endif
#include "nvml.h"
#include "_cgo_export.h"

const char *nvmlErrorString(nvmlReturn_t result) { return gpuSlicerErrorText(result); }

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                      const nvmlGpuInstancePlacement_t *placement,
                                                      nvmlGpuInstance_t *gpuInstance) {
    return gpuSlicerCreateGpuInstance(device, profileId, (nvmlGpuInstancePlacement_t *)placement,
                                      gpuInstance);
}

/* backend_loader.h - load a device backend plugin through the registry (core only).
 *
 * Every backend is a plugin .so of kind PL_KIND_BACKEND whose descriptor's
 * vtable is a pl_backend (backend.h), found in the plugin search path
 * (registry.h). The CPU slot holds "cpu" (cpu.so, plugins/backends/cpu),
 * loaded by the first CPU lookup (pl_backend_get: this file hands
 * backend_registry.c the loader when the library is loaded) or earlier by
 * pl_backend_load(reg, PL_DEVICE_CPU) from a registry with more dirs. The
 * accelerator slot (PL_DEVICE_CUDA) is filled by one of them per process:
 * "cuda" (cuda.so, the default) or "strict" (strict.so, the GPU-like
 * emulation of plugins/backends/strict).
 */
#ifndef PL_BACKEND_LOADER_H
#define PL_BACKEND_LOADER_H

#include "pipeline/backend.h"
#include "registry.h"

/* Make the backend of `type` available to pl_backend_get():
 * pl_backend_load_named(reg, type, "cpu" or "cuda"): PL_OK at once if that
 * backend is already registered (PL_ERR_DEVICE if another backend holds
 * the slot); else finds the plugin (kind backend) in `reg`, checks its
 * vtable (struct_size covers the ABI 2.0 pl_backend layout and a kernel
 * lookup is present, then its type and name, raw memory functions present),
 * asks it for the device count and registers it with pl_backend_register().
 * Errors (message names the plugin / search path / reason):
 *   PL_ERR_CONFIG / PL_ERR_ABI  the plugin is missing or refused by the registry,
 *   PL_ERR_ABI                  its vtable is not a usable pl_backend of
 *                               that type and name,
 *   PL_ERR_DEVICE               the plugin loaded but sees no GPU (driver
 *                               missing, no device, CUDA_VISIBLE_DEVICES empty).
 * `reg` may be NULL: a temporary registry over the default dirs is used. */
pl_status pl_backend_load(pl_registry *reg, pl_device_type type);

/* The same with the plugin named `name` (name.so, kind backend) instead of
 * the device type's default ("cuda"): for the conformance test and tools
 * that check another backend registering for the same device type, such as
 * "strict", the CPU-side emulation of a discrete GPU that `[pipeline]
 * device = strict` selects (plugins/backends/strict). Its vtable must have
 * type `type` and name `name`. NULL or "" = the default name. PL_OK at once
 * when backend `name` already holds the slot; PL_ERR_DEVICE naming both when
 * another backend does (one accelerator backend per process). */
pl_status pl_backend_load_named(pl_registry *reg, pl_device_type type, const char *name);

#endif

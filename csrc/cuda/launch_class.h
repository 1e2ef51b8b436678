// The architecture class a launch on a device runs as (arch_classes.h), with the developer switch that emulates
// another class on an sm_90 GPU.
#pragma once

#include <string>

#include "arch_classes.h"

namespace kdtree::cuda {

using kdtree::ArchClass;
using kdtree::kArchClasses;
using kdtree::limits_of;
using kdtree::ArchLimits;
using kdtree::arch_class_of;

// The class a launch on `device` runs as: its own, or under KDTREE_OPS_EMULATE_ARCH on an sm_90 device the
// emulated one (a developer switch, README "Developing"): that class's configurations and code path (mma.sync, no
// clusters, no programmatic launch), its shared-memory limits enforced through the launch attribute and the
// persistent grid, compiled for sm_90a. Read at each call (a host getenv). An emulation asked for on another GPU,
// or of an architecture no class has, raises.
ArchClass launch_class(int device);
// Whether `device` runs an emulated class (for messages).
bool emulating(int device);

// The gate (verified_families.h) for a launch on `device`: "" when `family` over `cache` may run as the class the
// launch runs as, else why not; check_verified raises that reason, prefixed with `op`.
std::string unverified_reason_on(const char* family, const char* cache, int device);
void check_verified(const char* op, const char* family, const char* cache, int device);

}  // namespace kdtree::cuda

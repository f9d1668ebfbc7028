// Names and sizes of c10::ScalarType and c10::DeviceType values, as torch prints them.
#include <array>
#include <string>

#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {
namespace {

struct DTypeEntry {
  const char* name;
  size_t size;
};

// Indexed by c10::ScalarType (c10/core/ScalarType.h); the values are stable across torch versions.
constexpr std::array<DTypeEntry, 30> kDTypes = {{
    {"uint8", 1},         {"int8", 1},           {"int16", 2},           {"int32", 4},
    {"int64", 8},         {"float16", 2},        {"float32", 4},         {"float64", 8},
    {"complex32", 4},     {"complex64", 8},      {"complex128", 16},     {"bool", 1},
    {"qint8", 1},         {"quint8", 1},         {"qint32", 4},          {"bfloat16", 2},
    {"quint4x2", 1},      {"quint2x4", 1},       {"bits1x8", 1},         {"bits2x4", 1},
    {"bits4x2", 1},       {"bits8", 1},          {"bits16", 2},          {"float8_e5m2", 1},
    {"float8_e4m3fn", 1}, {"float8_e5m2fnuz", 1}, {"float8_e4m3fnuz", 1}, {"uint16", 2},
    {"uint32", 4},        {"uint64", 8},
}};

// Indexed by c10::DeviceType (c10/core/DeviceType.h).
constexpr std::array<const char*, 21> kDevices = {
    "cpu", "cuda", "mkldnn", "opengl", "opencl", "ideep", "hip",  "fpga", "maia", "xla", "vulkan",
    "metal", "xpu", "mps",  "meta",   "hpu",    "ve",    "lazy", "ipu",  "mtia", "privateuseone"};

}  // namespace

const char* DTypeName(format::DType dtype) {
  if (dtype < 0 || static_cast<size_t>(dtype) >= kDTypes.size()) return "unknown";
  return kDTypes[dtype].name;
}

size_t DTypeSize(format::DType dtype) {
  if (dtype < 0 || static_cast<size_t>(dtype) >= kDTypes.size()) return 0;
  return kDTypes[dtype].size;
}

std::string DeviceName(const format::Device& device) {
  std::string name = device.type >= 0 && static_cast<size_t>(device.type) < kDevices.size()
                         ? kDevices[device.type]
                         : "device" + std::to_string(device.type);
  if (device.index >= 0) name += ":" + std::to_string(device.index);
  return name;
}

const char* ViolationKindName(ViolationKind kind) {
  switch (kind) {
    case ViolationKind::kSilent: return "silent";
    case ViolationKind::kDetached: return "detached";
    case ViolationKind::kFreed: return "freed";
    case ViolationKind::kUnpackHook: return "unpack_hook";
    case ViolationKind::kCachedMutated: return "cached_mutated";
    default: return "version";
  }
}

const char* SilentEvidenceName(SilentEvidence evidence) {
  switch (evidence) {
    case SilentEvidence::kAliasedWrite: return "aliased_write";
    case SilentEvidence::kFingerprint: return "fingerprint";
    case SilentEvidence::kCounterReset: return "counter_reset";
    case SilentEvidence::kUncheckedSave: return "unchecked_save";
    case SilentEvidence::kUnpackHook: return "unpack_hook";
    case SilentEvidence::kStorageSwap: return "storage_swap";
    default: return "";
  }
}

}  // namespace torchrr::replayer
